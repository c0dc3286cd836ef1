// Quantized gradient reductions (--quantize-reductions int8|int4, ZeRO++'s qgZ): the form a unit's
// gradient travels in inside the shard group and its sizes, shared by ShardedParams, which sends it, and
// the arithmetic that predicts what it moves and holds.
//
// A rank cuts its full unit gradient into the group's G shards and quantizes each on its own (blocks start
// at each shard's first element): chunk r, rank r's shard, becomes a record as ops::quantize_blocks writes
// it, the payload then the fp32 scales at ops::QuantizedSize::scales_offset(), a whole number of 32-bit
// words, so the G records of a rank travel as one i32 all-to-all. Owner r receives every rank's chunk r,
// dequantizes them in rank order and adds them in fp32, rounding once per addition: a gradient is
// quantized once, at its source, never a partial sum, so the error does not grow hop by hop as in a
// quantized ring reduce-scatter, and an element's error is at most the sum over the ranks of half their
// block's scale.
#pragma once
#include <cstdint>

#include <zshard/strategy.h>

#include "kernels/engine_ops.h"

namespace zshard {

// Blocks of 256, as the gathers' (shard/gather_quantization.h says why); 8 or 4 bits.
ops::QuantFormat reduction_quant_format(ReductionQuantization q);

// Bytes on the wire per reduced element, a block's scale spread over its elements: what the theory counts
// (each chunk's last partial block and word alignment add a few bytes per chunk).
double quantized_reduction_bytes_per_element(ReductionQuantization q);

// Bytes of one chunk's record for a shard of `shard_numel` elements.
int64_t quantized_chunk_bytes(int64_t shard_numel, ReductionQuantization q);

}  // namespace zshard
