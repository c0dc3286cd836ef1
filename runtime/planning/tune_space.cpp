#include "runtime/planning/tune_space.h"

#include <algorithm>

#include <zshard/error.h>

#include "shard/memory/divisors.h"
#include "shard/plan_internals.h"

namespace zshard {

namespace {

bool all_equal(const std::vector<int>& sizes) {
  return std::adjacent_find(sizes.begin(), sizes.end(), std::not_equal_to<>()) == sizes.end();
}

EstimateInput estimate_input(const TuneProblem& p, const Candidate& c) {
  PlanOptions o;
  o.strategy.kind = c.kind;
  if (c.kind == StrategyKind::hybrid)
    o.strategy.shard_group = all_equal(c.groups) ? ShardGroupRequest::equal(c.groups.front())
                                                 : ShardGroupRequest::list(c.groups);
  o.strategy.max_inflight = c.max_inflight;
  o.strategy.reshard_after_forward = c.reshard_after_forward;
  o.placement = {p.device, p.param_dtype, DType::f32, c.offload};
  EstimateInput in;
  in.model = p.model;
  in.plan = plan_for_world(o, p.world);
  in.rank_batch = c.auto_split ? c.max_rank_batch : c.batch / p.world;
  in.seq = p.seq;
  in.grad_accum = c.grad_accum;
  in.freeze = p.freeze;
  return in;
}

// Runs `f` with the model in the candidate's checkpointing mode, and leaves it at none.
template <class F>
auto in_mode(const TuneProblem& p, const Candidate& c, F f) {
  p.model->set_recompute(c.checkpointing);
  try {
    auto result = f(estimate_input(p, c));
    p.model->set_recompute(Recompute::none);
    return result;
  } catch (...) {
    p.model->set_recompute(Recompute::none);
    throw;
  }
}

bool can_recompute(Model& model) {
  try {
    model.set_recompute(Recompute::blocks);
  } catch (const UsageError&) {
    return false;
  }
  model.set_recompute(Recompute::none);
  return true;
}

}  // namespace

std::string Candidate::label() const {
  std::string s = detail::concat(strategy_name(kind));
  if (kind == StrategyKind::hybrid) s += " G" + join_sizes(groups);
  s += detail::concat(" b", batch, "x", grad_accum);
  if (checkpointing == Recompute::blocks) s += " blocks";
  if (offload) s += " offload";
  if (params_sharded(kind)) {
    if (max_inflight != StrategyOptions{}.max_inflight) s += detail::concat(" inflight", max_inflight);
    if (!reshard_after_forward) s += " keep";
  }
  if (auto_split) s += " auto";
  return s;
}

std::vector<std::string> Candidate::train_flags() const {
  std::vector<std::string> f = {"--strategy", std::string(strategy_name(kind)), "--batch", std::to_string(batch),
                                "--grad-accum", std::to_string(grad_accum)};
  if (kind == StrategyKind::hybrid) f.insert(f.end(), {"--shard-group", join_sizes(groups)});
  if (checkpointing == Recompute::blocks) f.insert(f.end(), {"--activation-checkpointing", "blocks"});
  if (offload) f.insert(f.end(), {"--offload", "optimizer"});
  if (params_sharded(kind)) {
    if (max_inflight != StrategyOptions{}.max_inflight) f.insert(f.end(), {"--max-inflight", std::to_string(max_inflight)});
    if (!reshard_after_forward) f.insert(f.end(), {"--reshard-after-forward", "false"});
  }
  if (auto_split) f.insert(f.end(), {"--rank-batches", "auto", "--max-rank-batch", std::to_string(max_rank_batch)});
  return f;
}

std::vector<std::vector<int>> hybrid_groupings(const TuneProblem& p) {
  if (p.hosts.size() > 1) return {p.hosts};
  std::vector<std::vector<int>> out;
  for (int g : divisors(p.world))
    if (g > 1 && g < p.world) out.push_back(std::vector<int>(size_t(p.world / g), g));
  return out;
}

std::vector<Candidate> enumerate_candidates(const TuneProblem& p, const TuneSpace& space) {
  if (p.global_batch % p.world != 0)
    throw UsageError(detail::concat("--global-batch: ", p.global_batch, " sequences do not divide over ", p.world,
                                    " ranks (give a multiple of ", p.world, ")"));
  const int per_rank = p.global_batch / p.world;
  std::vector<int> accums = space.grad_accums.empty() ? divisors(per_rank) : space.grad_accums;
  for (int k : accums)
    if (k < 1 || per_rank % k != 0)
      throw UsageError(detail::concat("--grad-accum ", k, " does not divide the ", per_rank,
                                      " sequences per rank of a global batch of ", p.global_batch, " on ", p.world,
                                      " ranks"));
  std::vector<Recompute> modes = space.checkpointing;
  if (!can_recompute(*p.model)) std::erase(modes, Recompute::blocks);
  if (modes.empty()) throw UsageError("--activation-checkpointing blocks: the model cannot recompute its blocks");
  std::vector<Candidate> out;
  for (StrategyKind kind : space.strategies) {
    const bool sharded = params_sharded(kind);
    std::vector<std::vector<int>> groupings = {{}};
    if (kind == StrategyKind::hybrid) groupings = hybrid_groupings(p);
    for (const std::vector<int>& groups : groupings)
      for (int k : accums)
        for (Recompute mode : modes)
          for (bool offload : space.offload)
            for (int inflight : sharded ? space.max_inflight : std::vector<int>{StrategyOptions{}.max_inflight})
              for (bool reshard : sharded ? space.reshard : std::vector<bool>{true})
                for (bool split : p.world > 1 ? space.auto_split : std::vector<bool>{false}) {
                  Candidate c{kind, groups, p.world * (per_rank / k), k, mode, offload, inflight, reshard, split};
                  if (split) {
                    c.max_rank_batch = c.batch / p.world;  // for the search below, which starts at one sequence
                    c.max_rank_batch = std::clamp(largest_fitting_rank_batch(p, c), c.batch / p.world,
                                                  c.batch - p.world + 1);
                  }
                  out.push_back(c);
                }
  }
  return out;
}

MemoryEstimate estimate_candidate(const TuneProblem& p, const Candidate& c) {
  return in_mode(p, c, [](const EstimateInput& in) { return estimate_memory(in); });
}

bool fits(const TuneProblem& p, const Candidate& c) { return estimate_candidate(p, c).total() <= p.budget; }

int largest_fitting_rank_batch(const TuneProblem& p, const Candidate& c) {
  return in_mode(p, c, [&](const EstimateInput& in) { return largest_rank_batch(in, p.budget); });
}

}  // namespace zshard
