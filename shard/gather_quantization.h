// Quantized parameter gathers (--quantize-gathers int8, ZeRO++'s qwZ): the form a rank's shard travels in
// and its sizes, shared by ShardedParams, which sends it, and the arithmetic that predicts what it moves
// and holds.
//
// A rank's record is its shard of the compute copy as ops::quantize_blocks writes it: the int8 payload,
// then the fp32 scales at ops::QuantizedSize::scales_offset(). The scales start 4-byte aligned and take 4
// bytes each, so a record is a whole number of 32-bit words and the gathers carry it as i32, which every
// backend all-gathers byte for byte. A shard is quantized by its owner alone, in the blocks of
// shard/chunk_blocks.h: cut at every parameter boundary and where the padding starts, so a block never
// mixes two parameters, and an element's error is at most its own parameter block's absmax / 254.
#pragma once
#include <cstdint>

#include "kernels/engine_ops.h"
#include "shard/flat_unit.h"

namespace zshard {

// At most 256 elements a scale. Small blocks keep a parameter's small values from being rounded on the
// scale of its own large ones; blocks that stop at each parameter's end keep them from a large neighbour
// (a layer norm's 1.0 beside a projection's 0.02): gathers in blocks of 256 that crossed parameters, beside
// int8 reductions in blocks that did not, ended tiny's eval loss +1.2%, +1.0%, +2.4% above unquantized
// zero3's, against -1.0%, +0.8%, +0.2% for those reductions alone (the settings of
// shard/reduction_quantization.h's figures). The scales cost 4 / 256 = 1.6% over the int8 payload,
// a little more for a unit of small parameters (each one's last block is short), which keeps a gather at
// about 51% of bf16's bytes and 25% of fp32's. DeepSpeed's qwZ picks groups of a few thousand elements
// per parameter, for fewer scales on large models; the tiny shards zshard's tests gather would get one
// block each there.
inline constexpr ops::QuantFormat kGatherQuantFormat{256, 8};
// Bytes on the wire per gathered element of parameters much longer than a block, a block's scale spread
// over its elements: what the theory counts where the model's units are not known (a model's own figure
// is record_bytes_per_element's, which also counts each parameter's short last block and the padding).
inline constexpr double kQuantizedGatherBytesPerElement = 1.0 + double(sizeof(float)) / kGatherQuantFormat.block;

// Bytes of the record each rank of `layout`'s group sends of its shard (chunk_record_size's).
int64_t quantized_shard_bytes(const FlatLayout& layout);

// What a gather of `layout`'s flat buffer holds while it is in flight: the compute buffer (`param_bytes`
// an element) and, `quantized`, every rank's record, which it lands in before they are dequantized. A
// buffer without parameters (a unit's trainable one when all of its parameters are frozen) sends nothing.
int64_t gathered_buffer_bytes(const FlatLayout& layout, int param_bytes, bool quantized);
// What a gather of a whole unit holds: its trainable buffer, always allocated (padding only when every
// parameter is frozen), and its frozen one, which exists only where it holds parameters.
int64_t unit_gathered_bytes(const FlatLayout& trainable, const FlatLayout& frozen, int param_bytes, bool quantized);

}  // namespace zshard
