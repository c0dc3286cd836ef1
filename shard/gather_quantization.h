// Quantized parameter gathers (--quantize-gathers int8, ZeRO++'s qwZ): the form a rank's shard travels in
// and its sizes, shared by ShardedParams, which sends it, and the arithmetic that predicts what it moves
// and holds.
//
// A rank's record is its shard of the compute copy as ops::quantize_blocks writes it: the int8 payload,
// then the fp32 scales at ops::QuantizedSize::scales_offset(). The scales start 4-byte aligned and take 4
// bytes each, so a record is a whole number of 32-bit words and the gathers carry it as i32, which every
// backend all-gathers byte for byte. Blocks start at each shard's first element: a shard is quantized by
// its owner alone.
#pragma once
#include <cstdint>

#include "kernels/engine_ops.h"
#include "shard/flat_unit.h"

namespace zshard {

// 256 elements a scale. An element's error is at most half its block's step, absmax / 254, so small blocks
// keep a unit's small weights from being rounded on the scale of a large neighbour (a layer norm's 1.0 beside
// a projection's 0.02); the scales cost 4 / 256 = 1.6% over the int8 payload, which keeps a gather at 51%
// of bf16's bytes and 25% of fp32's. DeepSpeed's qwZ picks groups of a few thousand elements per
// parameter, for fewer scales on large models; the tiny shards zshard's tests gather would get one block
// each there.
inline constexpr ops::QuantFormat kGatherQuantFormat{256, 8};
// Bytes on the wire per gathered element, a block's scale spread over its elements: what the theory counts
// (a record's last partial block and word alignment add a few bytes per shard).
inline constexpr double kQuantizedGatherBytesPerElement = 1.0 + double(sizeof(float)) / kGatherQuantFormat.block;

// Bytes of one rank's record for a shard of `shard_numel` elements.
int64_t quantized_shard_bytes(int64_t shard_numel);

// What a gather of `layout`'s flat buffer holds while it is in flight: the compute buffer (`param_bytes`
// an element) and, `quantized`, every rank's record, which it lands in before they are dequantized. A
// buffer without parameters (a unit's trainable one when all of its parameters are frozen) sends nothing.
int64_t gathered_buffer_bytes(const FlatLayout& layout, int param_bytes, bool quantized);
// What a gather of a whole unit holds: its trainable buffer, always allocated (padding only when every
// parameter is frozen), and its frozen one, which exists only where it holds parameters.
int64_t unit_gathered_bytes(const FlatLayout& trainable, const FlatLayout& frozen, int param_bytes, bool quantized);

}  // namespace zshard
