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
  EstimateInput in;
  in.model = p.model;
  in.plan = candidate_plan(p, c);
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

// Whether the runtime runs the candidate as it says: it refuses none of it, and a secondary shard it asks
// for has groups (on one host it has none, and would be the candidate without it). Else its first refusal.
std::string refusal(const TuneProblem& p, const Candidate& c) {
  try {
    const ShardPlan plan = candidate_plan(p, c);
    if (c.secondary_shard.kind != SecondaryShard::Kind::none && !plan.secondary_groups)
      return detail::concat("--secondary-shard ", secondary_shard_text(c.secondary_shard), ": all ", p.world,
                            " ranks run on one host, where it would be plain zero3");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

// The values of the dimensions a strategy has of its own, each once: the space's where it takes them
// (strategy_options_for), the defaults elsewhere.
std::vector<StrategyOptions> strategy_variants(StrategyKind kind, const TuneSpace& space) {
  std::vector<StrategyOptions> out;
  for (int inflight : space.max_inflight)
    for (bool reshard : space.reshard)
      for (GatherQuantization gathers : space.quantize_gathers)
        for (ReductionQuantization reductions : space.quantize_reductions)
          for (const SecondaryShard& secondary : space.secondary_shard) {
            const StrategyOptions v =
                strategy_options_for(kind, {kind, {}, reshard, inflight, gathers, reductions, secondary});
            if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
          }
  return out;
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
  if (quantize_gathers != GatherQuantization::none)
    s += detail::concat(" gathers-", gather_quantization_name(quantize_gathers));
  if (quantize_reductions != ReductionQuantization::none)
    s += detail::concat(" reductions-", reduction_quantization_name(quantize_reductions));
  if (secondary_shard.kind != SecondaryShard::Kind::none) s += " secondary-" + secondary_shard_text(secondary_shard);
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
  if (quantize_gathers != GatherQuantization::none)
    f.insert(f.end(), {"--quantize-gathers", std::string(gather_quantization_name(quantize_gathers))});
  if (quantize_reductions != ReductionQuantization::none)
    f.insert(f.end(), {"--quantize-reductions", std::string(reduction_quantization_name(quantize_reductions))});
  if (secondary_shard.kind != SecondaryShard::Kind::none)
    f.insert(f.end(), {"--secondary-shard", secondary_shard_text(secondary_shard)});
  if (auto_split) f.insert(f.end(), {"--rank-batches", "auto", "--max-rank-batch", std::to_string(max_rank_batch)});
  return f;
}

ShardPlan candidate_plan(const TuneProblem& p, const Candidate& c) {
  PlanOptions o;
  StrategyOptions& s = o.strategy;
  s.kind = c.kind;
  if (c.kind == StrategyKind::hybrid)
    s.shard_group =
        all_equal(c.groups) ? ShardGroupRequest::equal(c.groups.front()) : ShardGroupRequest::list(c.groups);
  s.max_inflight = c.max_inflight;
  s.reshard_after_forward = c.reshard_after_forward;
  s.quantize_gathers = c.quantize_gathers;
  s.quantize_reductions = c.quantize_reductions;
  s.secondary_shard = c.secondary_shard;
  o.placement = {p.device, p.param_dtype, DType::f32, c.offload};
  return plan_on_hosts(o, p.hosts.empty() ? std::vector<int>{p.world} : p.hosts);
}

std::vector<std::vector<int>> hybrid_groupings(const TuneProblem& p) {
  // Hosts of one rank each as the groups: groups of one, which run as ddp, ddp's candidates already.
  if (p.hosts.size() > 1) {
    if (std::all_of(p.hosts.begin(), p.hosts.end(), [](int h) { return h == 1; })) return {};
    return {p.hosts};
  }
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
    std::vector<std::vector<int>> groupings = {{}};
    if (kind == StrategyKind::hybrid) groupings = hybrid_groupings(p);
    std::string first_refusal;
    size_t kept = 0;
    for (const std::vector<int>& groups : groupings)
      for (int k : accums)
        for (Recompute mode : modes)
          for (bool offload : space.offload)
            for (const StrategyOptions& v : strategy_variants(kind, space))
              for (bool split : p.world > 1 ? space.auto_split : std::vector<bool>{false}) {
                Candidate c{kind, groups, p.world * (per_rank / k), k, mode, offload, v.max_inflight,
                            v.reshard_after_forward, split};
                c.quantize_gathers = v.quantize_gathers;
                c.quantize_reductions = v.quantize_reductions;
                c.secondary_shard = v.secondary_shard;
                if (const std::string why = refusal(p, c); !why.empty()) {
                  if (first_refusal.empty()) first_refusal = why;
                  continue;
                }
                if (split) {
                  c.max_rank_batch = c.batch / p.world;  // for the search below, which starts at one sequence
                  c.max_rank_batch = std::clamp(largest_fitting_rank_batch(p, c), c.batch / p.world,
                                                c.batch - p.world + 1);
                }
                out.push_back(c);
                ++kept;
              }
    if (kept == 0 && !first_refusal.empty())
      throw UsageError(
          detail::concat("--strategies ", strategy_name(kind), ": no candidate runs as asked: ", first_refusal));
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
