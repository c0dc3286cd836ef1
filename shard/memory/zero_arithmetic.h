// The ZeRO paper's arithmetic for model-state bytes and communication volume per rank, for any
// strategy, world size and dtype policy. The memory report prints it beside what the allocator
// measured; the estimator (zshard-mem) uses it for models that were never run.
#pragma once
#include <cstdint>
#include <vector>

#include <zshard/dtype.h>
#include <zshard/memory_report.h>
#include <zshard/plan.h>

#include "shard/comm_volume.h"

namespace zshard {

struct DtypePolicy {
  int param_bytes = 4;      // compute copy of the parameters
  int grad_bytes = 4;
  int optimizer_bytes = 8;  // K per parameter: Adam m+v in fp32 (+4 for an fp32 master copy in mixed precision)
  // zero3 and hybrid gather int8 (--quantize-gathers int8): each rank also keeps its shard quantized, the
  // record its gathers send (shard/gather_quantization.h), counted with the parameters (or the frozen ones).
  bool quantized_gathers = false;
  // Gradients reduced inside the shard group as quantized chunks (--quantize-reductions,
  // shard/reduction_quantization.h): what they move, and the records a reduction in flight holds.
  ReductionQuantization quantized_reductions = ReductionQuantization::none;
  static DtypePolicy fp32() { return {4, 4, 8}; }
  static DtypePolicy mixed_bf16() { return {2, 2, 12}; }
  // The policy of parameters (and gradients) kept in `param_dtype`, gathered and reduced as `gathers` and
  // `reductions` say, as ShardedParams keeps them.
  static DtypePolicy of(DType param_dtype, GatherQuantization gathers = GatherQuantization::none,
                        ReductionQuantization reductions = ReductionQuantization::none) {
    DtypePolicy d = param_dtype == DType::bf16 ? mixed_bf16() : fp32();
    d.quantized_gathers = gathers == GatherQuantization::int8;
    d.quantized_reductions = reductions;
    return d;
  }
};

// psi: parameter elements. `group` is the shard group size (world for zero1/2/3, G for hybrid, 1 for
// ddp), as returned by shard_group_size(). ddp 16Ψ, zero1 4Ψ+12Ψ/N, zero2 2Ψ+14Ψ/N, zero3 16Ψ/N with
// the mixed-precision policy. With `offload_optimizer` the optimizer bytes move to the host, where an
// fp32 master of its own joins Adam m and v (12Ψ/N whatever the dtypes), and the host copy of the owned
// gradients that AdamW steps from (offloaded_bytes_per_param). `frozen_psi` more parameters are frozen:
// their compute copy (param bytes, sharded with the others), and nothing else.
ModelStateBytes predict_model_states(StrategyKind kind, int group, int64_t psi, const DtypePolicy& dtypes,
                                     bool offload_optimizer = false, Device device = Device::cpu,
                                     int64_t frozen_psi = 0);
constexpr int kOffloadedOptimizerBytes = 12;
// Host bytes per owned parameter of zshard's offloaded optimizer: master, m and v, plus the gradients' host
// copy, except on the cpu in fp32, where AdamW reads the gradients where they are (in bf16 the copy is
// where AdamW writes the bf16 parameters that go back, as on a GPU).
int offloaded_bytes_per_param(const DtypePolicy& dtypes, Device device);
// ZeRO-Offload's own split (Ren et al. 2021), for comparison: the gradients too go to the host, beside the
// 12 bytes of optimizer state ((12 + grad bytes)Ψ/N there), and the device keeps only the parameters.
// zshard also keeps the owned gradients on the device: they accumulate over micro-steps there and give
// the gradient norm without a host pass.
ModelStateBytes predict_zero_offload(StrategyKind kind, int group, int64_t psi, const DtypePolicy& dtypes);

// Sum of the `k` largest of `sizes`.
int64_t sum_of_largest(std::vector<int64_t> sizes, int k);

// Bytes of gathered parameters a rank holds at once when parameters are sharded, from what each unit's
// gather holds (gathered_buffer_bytes of its buffers): the --max-inflight largest units (prefetch keeps
// that many gathered), or every unit when they stay gathered from the forward to the backward
// (reshard_after_forward off). With quantized gathers a bound: a unit's received records are freed once
// the model takes the unit.
int64_t predict_gathered_bytes(const std::vector<int64_t>& unit_bytes, int max_inflight, bool reshard_after_forward);

// Bytes one rank of a shard group of `group` ranks moves per optimizer step, with `grad_accum`
// micro-steps: comm_volume's total (shard/comm_volume.h) on `groups`. `gathered` is the elements zero3
// and hybrid gather per micro-step: the paper's 2Ψ, or the model's own schedule
// (ShardedParams::gathered_numel_per_micro_step), which gathers an untied Llama's embedding and head once
// each; `secondary` of them are gathered inside a secondary group of `secondary_group` ranks.
struct GatherSchedule {
  int64_t gathered = 0;
  int64_t secondary = 0;
  int secondary_group = 1;
};
// `quantized` is the model's bytes per element of its quantized collectives, where it quantizes any.
int64_t predict_comm_bytes(StrategyKind kind, const ShardGroups& groups, int group, int64_t psi,
                           const GatherSchedule& gathers, int grad_accum, const DtypePolicy& dtypes,
                           const QuantizedBytes& quantized = {});

}  // namespace zshard
