#include "tests/support/training_runs.h"

#include <cmath>

#include "comm/self_communicator.h"
#include "shard/engine_internals.h"

namespace zshard::test {

TrainOptions tiny_options(int steps) {
  TrainOptions o;
  o.model.name = "tiny";
  o.data.batch = 8;
  o.data.seq = 32;
  o.optimizer.steps = steps;
  o.optimizer.lr = 3e-3f;
  // GPT-2's key bias has an exactly zero true gradient (softmax ignores a constant shift of the scores),
  // so what backward computes for it is rounding noise, which differs with the order of any sum - and
  // sharding reorders sums. With eps 1e-8 Adam would turn that noise into full-size steps of random
  // sign; eps 1e-6 keeps the comparison about the strategies, not about amplified rounding.
  o.optimizer.eps = 1e-6f;
  o.optimizer.warmup = 3;
  o.optimizer.grad_clip = 1.0f;  // active: the tiny model's early gradient norms are above 1
  o.model.seed = 7;
  return o;
}

RunResult train(const TrainOptions& options, comm::Communicator& comm) {
  Trainer trainer(options, comm);
  trainer.run(nullptr);
  RunResult r;
  for (const auto& h : trainer.history()) {
    r.losses.push_back(h.loss);
    r.grad_norms.push_back(h.grad_norm);
    r.rank_batches.push_back(h.rank_batches);
    r.comm_bytes.push_back(h.comm_bytes);
    if (!std::isnan(h.eval_loss)) r.eval_losses.push_back(h.eval_loss);
  }
  for (int u = 0; u < EngineInternals::params(trainer.engine()).num_units(); ++u) {
    ShardedParams& params = EngineInternals::params(trainer.engine());
    const FlatValues full = params.whole_unit_params(u);  // frozen parameters too, in UnitSpec order
    r.params.insert(r.params.end(), full.begin(), full.begin() + params.layout(u).numel() + params.frozen_layout(u).numel());
  }
  return r;
}

RunResult train_single_process(const TrainOptions& options) {
  comm::SelfCommunicator self;
  TrainOptions single = options;
  single.plan.strategy = StrategyOptions{};
  single.data.rank_batches.clear();
  single.data.rank_batches_auto = false;
  single.data.max_rank_batch.reset();
  single.data.rebalance_every.reset();
  return train(single, self);
}

std::vector<StrategyOptions> strategies_for(int world) {
  std::vector<StrategyOptions> out;
  for (StrategyKind k : {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2, StrategyKind::zero3})
    out.push_back({k, {}, true, 2});
  out.push_back({StrategyKind::zero3, {}, false, 2});  // keep gathered params until backward
  // hybrid with every group size that divides the world (G = 1 and G = world are the corner cases)
  for (int g = 1; g <= world; ++g)
    if (world % g == 0) out.push_back({StrategyKind::hybrid, ShardGroupRequest::equal(g), true, 2});
  // hybrid with groups of unequal sizes (a node of 2 beside a node of 1; groups of 1 beside one of 2, whose
  // shards each span two of the others' pieces)
  if (world == 3) out.push_back({StrategyKind::hybrid, ShardGroupRequest::list({2, 1}), true, 2});
  if (world == 4) {
    out.push_back({StrategyKind::hybrid, ShardGroupRequest::list({3, 1}), true, 2});
    out.push_back({StrategyKind::hybrid, ShardGroupRequest::list({1, 2, 1}), true, 2});
  }
  return out;
}

std::string describe(const StrategyOptions& s) {
  std::string d(strategy_name(s.kind));
  if (s.kind == StrategyKind::hybrid)
    d += " G=" + s.shard_group.text();
  if (!s.reshard_after_forward) d += " no-reshard";
  if (s.quantize_gathers != GatherQuantization::none)
    d += " gathers " + std::string(gather_quantization_name(s.quantize_gathers));
  if (s.secondary_shard.kind != SecondaryShard::Kind::none) d += " secondary " + secondary_shard_text(s.secondary_shard);
  if (s.quantize_reductions != ReductionQuantization::none)
    d += " reductions " + std::string(reduction_quantization_name(s.quantize_reductions));
  return d;
}

}  // namespace zshard::test
