#include "shard/comm_volume.h"

#include "shard/gather_quantization.h"
#include "shard/reduction_quantization.h"

namespace zshard {

CommVolume comm_volume(const CommShape& s) {
  // One collective over n elements of `bytes` in a group of g.
  const auto move = [](double n, int g, double bytes) { return n * bytes * (g - 1) / g; };
  const auto pass = [&](int g, int bytes) { return move(double(s.psi), g, bytes); };
  const int K = s.grad_accum;
  // The in-group reduction of the strategies that reduce-scatter, over a group of g.
  const auto reduction = [&](int g) {
    const ReductionQuantization q = s.quantized_reductions;
    return move(double(s.psi), g,
                q != ReductionQuantization::none
                    ? s.quantized_bytes.reduction.value_or(quantized_reduction_bytes_per_element(q))
                    : s.grad_bytes);
  };
  CommVolume v;
  // Hybrid with groups of one runs as ddp (ShardPlan::runs_as_ddp).
  const bool as_ddp = s.kind == StrategyKind::hybrid && s.replicas == s.world;
  switch (as_ddp ? StrategyKind::ddp : s.kind) {
    case StrategyKind::ddp: v.reduce = 2 * pass(s.world, s.grad_bytes); break;
    case StrategyKind::zero1:
      v.reduce = reduction(s.world);
      v.gather = pass(s.world, s.param_bytes);
      break;
    case StrategyKind::zero2:
      v.reduce = K * reduction(s.world);
      v.gather = pass(s.world, s.param_bytes);
      break;
    case StrategyKind::zero3:
    case StrategyKind::hybrid:
      v.gather = K * move(double(s.gathered - s.secondary_gathered), s.group,
                          s.quantized_gathers ? s.quantized_bytes.gather.value_or(kQuantizedGatherBytesPerElement)
                                              : double(s.param_bytes));
      v.secondary = K * move(double(s.secondary_gathered), s.secondary_group, s.param_bytes);
      v.reduce = K * reduction(s.group);
      v.across = K * 2 * pass(s.replicas, s.grad_bytes) / s.group;
      break;
  }
  return v;
}

}  // namespace zshard
