// The bytes one rank moves per optimizer step under each strategy, the ZeRO paper's volumes in the bus
// convention of nccl-tests: a collective over n elements in a group of g moves (g-1)/g of them per rank,
// an all-reduce twice that. The one statement of them: the memory report's prediction
// (predict_comm_bytes), zshard-tune's cost model and zshard-project's projection all read it.
#pragma once
#include <cstdint>
#include <optional>

#include <zshard/plan.h>

namespace zshard {

// The bytes per element of the quantized gathers and reductions, scales included: a model's own where its
// units are known (record_bytes_per_element, shard/chunk_blocks.h: each parameter's last block is short,
// and the padding travels too), or unset, the figure of parameters much longer than a block
// (kQuantizedGatherBytesPerElement, quantized_reduction_bytes_per_element).
struct QuantizedBytes {
  std::optional<double> gather, reduction;
};

struct CommShape {
  StrategyKind kind = StrategyKind::ddp;
  int world = 1;         // ranks: ddp, zero1 and zero2 reduce and gather over all of them
  int group = 1;         // ranks of the shard group that zero3 and hybrid gather and reduce-scatter in
  int replicas = 1;      // hybrid: the groups each shard is all-reduced across (R = N/G for groups of one size)
  int64_t psi = 0;       // parameter elements
  int64_t gathered = 0;  // elements zero3 and hybrid gather per micro-step: the paper's 2Ψ, or a model's schedule
  int grad_accum = 1;    // micro-steps per optimizer step
  int param_bytes = 4;   // per element of the parameters gathered and of the gradients reduced
  int grad_bytes = 4;
  // zero3 and hybrid gather int8 with block scales (--quantize-gathers int8): quantized_bytes.gather an
  // element rather than param_bytes (shard/gather_quantization.h).
  bool quantized_gathers = false;
  // zero1, zero2, zero3 and hybrid reduce inside the shard group as quantized chunks
  // (--quantize-reductions): quantized_bytes.reduction an element rather than grad_bytes
  // (shard/reduction_quantization.h). Hybrid's all-reduce across groups keeps grad_bytes.
  ReductionQuantization quantized_reductions = ReductionQuantization::none;
  QuantizedBytes quantized_bytes = {};
  // zero3 with secondary groups (--secondary-shard): of `gathered`, the elements gathered inside a
  // secondary group of secondary_group ranks from the shares kept after forward, in the param dtype.
  int64_t secondary_gathered = 0;
  int secondary_group = 1;
};

// Bus bytes per optimizer step of one rank, by the collectives that move them.
struct CommVolume {
  double gather = 0;  // parameter all-gathers: zero1 and zero2 once after the step, zero3 and hybrid each micro-step
  double reduce = 0;  // gradients inside the group: ddp's all-reduce, the reduce-scatters of the others
  double across = 0;  // hybrid: each shard's all-reduce across the replicas, every micro-step
  double secondary = 0;  // zero3 with secondary groups: the gathers inside them, every micro-step
  double total() const { return gather + reduce + across + secondary; }
};

// ddp 2Ψ(N-1)/N; zero1 the same, as a reduce-scatter and an all-gather; zero2 reduce-scatters every
// micro-step; zero3 3Ψ(G-1)/G per micro-step (gathering 2Ψ); hybrid zero3's volume inside its group plus
// an all-reduce of its shard across the R groups, 2(Ψ/G)(R-1)/R (unequal groups reduce each piece of the
// shard among R owners: the same volume). Quantized gathers move (1 + 4/256)/param_bytes of the gathers'
// bytes; quantized reductions (bits/8 + 4/block)/grad_bytes of the in-group reductions' bytes (blocks of
// 256 for int8, 64 for int4), an all-to-all moving what a reduce-scatter of as many bytes does; both a
// little more for a model of short parameters, as its QuantizedBytes say. Secondary groups of h move the
// gathers from the kept shares, (h-1)/h of them, unquantized, and the rest of the gathers stay in the
// shard group.
CommVolume comm_volume(const CommShape& shape);

}  // namespace zshard
