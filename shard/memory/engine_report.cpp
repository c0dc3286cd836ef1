#include "shard/memory/engine_report.h"

#include <map>
#include <string>

#include "kernels/allocator.h"
#include "shard/chunk_blocks.h"
#include "shard/gather_quantization.h"
#include "shard/memory/zero_arithmetic.h"
#include "shard/plan_internals.h"
#include "shard/reduction_quantization.h"
#include "shard/sharded_params.h"

namespace zshard {

namespace {

// Per-rank record shipped through one all-gather of doubles (byte counts stay exact below 2^53).
constexpr int kRecord = 2 * kNumCategories + 5;

std::vector<double> encode(const RankMemory& r) {
  std::vector<double> v;
  for (int c = 0; c < kNumCategories; ++c) v.push_back(double(r.stats.live[c]));
  for (int c = 0; c < kNumCategories; ++c) v.push_back(double(r.stats.peak[c]));
  v.push_back(double(r.stats.live_total));
  v.push_back(double(r.stats.peak_total));
  v.push_back(double(r.stats.model_states_peak));
  v.push_back(r.comm_bytes_per_step);
  v.push_back(r.comm_exposed_ms_per_step);
  return v;
}

RankMemory decode(const double* v) {
  RankMemory r;
  for (int c = 0; c < kNumCategories; ++c) r.stats.live[c] = int64_t(v[c]);
  for (int c = 0; c < kNumCategories; ++c) r.stats.peak[c] = int64_t(v[kNumCategories + c]);
  r.stats.live_total = int64_t(v[2 * kNumCategories]);
  r.stats.peak_total = int64_t(v[2 * kNumCategories + 1]);
  r.stats.model_states_peak = int64_t(v[2 * kNumCategories + 2]);
  r.comm_bytes_per_step = v[2 * kNumCategories + 3];
  r.comm_exposed_ms_per_step = v[2 * kNumCategories + 4];
  return r;
}

// This rank's memory on `device`. On a GPU the host column is the host allocator's (the offloaded
// optimizer's state and staging), while the totals stay the device's, what its memory holds; that host
// memory is allocated once, at set-up, so its peak adds to the device's model-state peak.
MemStats rank_memory(Device device) {
  MemStats stats = Allocator::of(device).stats();
  if (device == Device::cpu) return stats;
  const MemStats host = Allocator::of(Device::cpu).stats();
  const int c = int(Category::host);
  stats.live[c] = host.live[c];
  stats.peak[c] = host.peak[c];
  stats.model_states_peak += host.peak[c];
  return stats;
}

// What the quantized collectives of `params`' units move per element in a shard group of `group` ranks:
// the records of every unit's chunks as that group cuts them.
QuantizedBytes quantized_bytes(const ShardedParams& params, int group, const DtypePolicy& dtypes) {
  QuantizedBytes out;
  if (!dtypes.quantized_gathers && dtypes.quantized_reductions == ReductionQuantization::none) return out;
  std::vector<FlatLayout> trainable, every;
  const int pad_multiple = params.groups().pad_multiple();
  for (int u = 0; u < params.num_units(); ++u) {
    trainable.emplace_back(params.layout(u).spec(), group, pad_multiple);
    every.push_back(trainable.back());
    every.emplace_back(params.frozen_layout(u).spec(), group, pad_multiple);
  }
  if (dtypes.quantized_gathers) out.gather = record_bytes_per_element(every, kGatherQuantFormat);
  if (dtypes.quantized_reductions != ReductionQuantization::none)
    out.reduction = record_bytes_per_element(trainable, reduction_quant_format(dtypes.quantized_reductions));
  return out;
}

}  // namespace

MemoryReport measure_memory(ShardedParams& params, comm::Communicator& world, int grad_accum,
                            const std::vector<std::pair<int64_t, double>>& step_comm) {
  MemoryReport rep;
  const ShardPlan& plan = params.plan();
  rep.strategy = std::string(strategy_name(plan.kind));
  rep.world = world.size();
  const ShardGroups& groups = plan.groups;
  rep.shard_group = groups.size_of_rank(0);
  rep.shard_group_sizes = groups.sizes();
  if (plan.secondary_groups) rep.secondary_group_sizes = plan.secondary_groups->sizes();
  const Placement& placement = plan.placement;
  const DtypePolicy dtypes = DtypePolicy::of(placement.param_dtype, plan.quantize_gathers, plan.quantize_reductions);
  std::vector<int64_t> gathered_sizes;  // what a gather of each unit holds, in bytes
  for (int u = 0; u < params.num_units(); ++u) {
    rep.params += params.layout(u).numel() + params.frozen_layout(u).numel();
    rep.frozen_params += params.frozen_layout(u).numel();
    gathered_sizes.push_back(unit_gathered_bytes(params.layout(u), params.frozen_layout(u), dtypes.param_bytes,
                                                 dtypes.quantized_gathers));
  }
  const int64_t trainable = rep.params - rep.frozen_params;  // what has gradients to reduce
  rep.device = std::string(device_name(placement.device));
  rep.param_dtype = std::string(dtype_flag(placement.param_dtype));
  rep.reduce_dtype = std::string(dtype_flag(placement.reduce_dtype));
  if (placement.offload_optimizer)
    rep.predicted_zero_offload = predict_zero_offload(plan.kind, rep.shard_group, trainable, dtypes);
  rep.predicted_inflight =
      plan.params_sharded() ? predict_gathered_bytes(gathered_sizes, plan.max_inflight, plan.reshard_after_forward) : 0;
  DtypePolicy traffic = dtypes;  // gradients travel in the reduce dtype
  traffic.grad_bytes = int(dtype_size(placement.reduce_dtype));

  // The model's own gather schedule where a step has recorded it, the paper's 2Ψ before (with secondary
  // groups, backward's Ψ inside them).
  const bool recorded = params.gathered_numel_per_micro_step() > 0;
  GatherSchedule gathers{recorded ? params.gathered_numel_per_micro_step() : 2 * rep.params};
  if (plan.secondary_groups) gathers.secondary = recorded ? params.secondary_gathered_numel_per_micro_step() : rep.params;
  std::map<int, QuantizedBytes> quantized_by_group;  // each group size's own cut of the units
  RankMemory mine;
  mine.stats = rank_memory(placement.device);
  for (const auto& [bytes, exposed_ms] : step_comm) {
    mine.comm_bytes_per_step += double(bytes) / double(step_comm.size());
    mine.comm_exposed_ms_per_step += exposed_ms / double(step_comm.size());
  }
  const std::vector<double> local = encode(mine);
  std::vector<double> all(size_t(kRecord) * world.size());
  world.all_gather(local.data(), all.data(), kRecord, DType::f64)->wait();
  for (int r = 0; r < world.size(); ++r) {
    RankMemory& rank = rep.ranks.emplace_back(decode(all.data() + size_t(r) * kRecord));
    rank.shard_group = groups.size_of_rank(r);
    rank.predicted = predict_model_states(plan.kind, rank.shard_group, trainable, dtypes,
                                          placement.offload_optimizer, placement.device, rep.frozen_params);
    // Frozen parameters are gathered like the others, and have no gradient to reduce nor update to
    // re-gather: the gradient terms count the trainable ones.
    if (plan.secondary_groups) gathers.secondary_group = plan.secondary_groups->size_of_rank(r);
    auto [figures, fresh] = quantized_by_group.try_emplace(rank.shard_group);
    if (fresh) figures->second = quantized_bytes(params, rank.shard_group, dtypes);
    rank.predicted_comm_bytes = predict_comm_bytes(plan.kind, groups, rank.shard_group, trainable, gathers, grad_accum,
                                                   traffic, figures->second);
  }
  rep.predicted = rep.ranks[0].predicted;
  rep.predicted_comm_bytes = rep.ranks[0].predicted_comm_bytes;
  return rep;
}

}  // namespace zshard
