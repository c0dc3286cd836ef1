// Quantized gradient reductions (--quantize-reductions int8|int4, ZeRO++'s qgZ): the form a unit's
// gradient travels in inside the shard group and its sizes, shared by ShardedParams, which sends it, and
// the arithmetic that predicts what it moves and holds.
//
// A rank cuts its full unit gradient into the group's G shards and quantizes each on its own, in the
// blocks of shard/chunk_blocks.h (cut at every parameter boundary and where the padding starts, so that a
// LayerNorm weight's small gradient is not rounded on its neighbour's scale): chunk r, rank r's shard,
// becomes a record as ops::quantize_blocks writes it, the payload then the fp32 scales at
// ops::QuantizedSize::scales_offset(), a whole number of 32-bit words, every chunk of the unit in the
// record of its largest, so the G records of a rank travel as one i32 all-to-all. Owner r receives every
// rank's chunk r, dequantizes them in rank order and adds them in fp32, rounding once per addition: a
// gradient is quantized once, at its source, never a partial sum, so the error does not grow hop by hop
// as in a quantized ring reduce-scatter, and an element's error is at most the sum over the ranks of half
// their block's scale, each block's absmax / qmax within one parameter.
#pragma once
#include <cstdint>

#include <zshard/strategy.h>

#include "kernels/engine_ops.h"
#include "shard/flat_unit.h"

namespace zshard {

// int8: blocks of at most 256, as the gathers' (shard/gather_quantization.h says why). int4: at most 64.
// With 7 levels a side a block's step is absmax / 7, and the more elements a block holds, the more of them
// lie far below its absmax and round to 0. Eval loss against unquantized zero3's (--model tiny --batch 8
// --seq 64, np 4, zero3, 300 steps, seeds 1, 2, 3; blocks cut at parameter boundaries): int4 in blocks
// of 256 +2.0%, +1.7%, +2.3%, in blocks of 64 +0.2%, +1.1%, +1.0%, near int8's -1.0%, +0.8%, +0.2%. The
// scales then cost 4 / 64 bytes an element: 0.56 bytes an element in int4, against 1.02 in int8.
ops::QuantFormat reduction_quant_format(ReductionQuantization q);

// Bytes on the wire per reduced element of parameters much longer than a block, a block's scale spread
// over its elements: what the theory counts where the model's units are not known (a model's own figure
// is record_bytes_per_element's, which also counts each parameter's short last block and the padding).
double quantized_reduction_bytes_per_element(ReductionQuantization q);

// Bytes of the record each chunk of `layout`'s gradient travels in (chunk_record_size's).
int64_t quantized_chunk_bytes(const FlatLayout& layout, ReductionQuantization q);

}  // namespace zshard
