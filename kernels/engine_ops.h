// The ops the sharding engine calls and a model never does: AdamW on owned shards, the gradient norm's
// sum of squares and the step's other scalars, accumulation, dtype conversion, block quantization and the
// host's wait for the device. Dispatched on the device like the model ops (<zshard/ops.h>), whose
// conventions they share.
//
// A training step keeps its scalars (StepScalars: the loss and norm sums, the clip factor) in device
// memory: the ops below add to them and read them there, so the host queues a whole step without waiting
// for the device, and reads them once, at the step's end (read_back).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <zshard/dtype.h>

#include "kernels/cpu/ops.h"

namespace zshard::ops {

using cpu::AdamWParams;
using cpu::ShardSegment;
using cpu::StepScalars;

// AdamW on the segments of an fp32 master shard with gradients G (float or bf16), all in one pass (one
// launch on cuda), with the factors in step->settings.adamw (set_step_settings): a segment decays where it
// says so, and an element in no segment (the padding) is left as it is. The gradient is scaled by
// step->grad_scale, and nothing is written when step->skip is set: `step` is in d's memory, where
// clip_grad_norm wrote it, so the host never reads it first. param_bf16, when given, receives the bf16
// compute copy of the updated parameters in the same pass (on cpu it may alias grad: kernels/cpu/ops.h).
// The result is the CPU reference's per segment, bit for bit (cpu::adamw_step).
template <class G>
void adamw_step(Device d, float* param, const G* grad, float* m, float* v, std::span<const ShardSegment> segments,
                const StepScalars* step, bf16* param_bf16 = nullptr);
// step->settings = *settings (AdamW's factors from cpu::adamw_factors, the clip bound), in d's memory. On
// cuda a copy queued on the compute stream: `settings` must stay as they are until it is done, in
// page-locked host memory so that the copy is asynchronous (and so that a CUDA graph that recorded it
// copies from there again when replayed).
void set_step_settings(Device d, StepScalars* step, const cpu::StepSettings* settings);
// Adds to *sum, a double in d's memory, the sum of squares of every element of every part: each part's sum
// in double, added to *sum in part order. One launch on cuda (per 64 parts); nothing waits.
template <class T>
void sum_squares(Device d, double* sum, std::span<const std::span<const T>> parts);
// *sum = first + values[0] + ... + values[n - 1], in that order (kernels/step_scalars.h); doubles in d's
// memory, `first` from the host. One thread on cuda; nothing waits.
void sum_in_order(Device d, double* sum, const double* values, size_t n, double first = 0);
// torch's clip_grad_norm_ on step->norm_squares with step->settings.max_norm, in d's memory
// (kernels/step_scalars.h): the norm, the factor AdamW scales by (max_norm 0: 1) and whether the step must
// be skipped. One thread on cuda.
void clip_grad_norm(Device d, StepScalars* step);
// y += alpha * x
template <class T>
void axpy(Device d, T* y, const T* x, float alpha, size_t n);

// dst[i] = src[i] converted between f32 and bf16 (rounding to nearest even), or copied when the types
// match. Both arrays on `d`.
void convert(Device d, void* dst, DType dst_type, const void* src, DType src_type, size_t n);

// Symmetric per-block absmax quantization, for weights gathered and gradients reduced in 8 or 4 bits over
// slow links (ZeRO++'s qwZ and qgZ). `blocks`, a HostBlockTable built for f (its host_table(), or its
// table_at() a copy in the device's memory), cuts the n elements into pieces and each piece into blocks of
// f.block consecutive elements from its own start, its last block shorter; the engine's pieces are the
// parameters a chunk holds (shard/chunk_blocks.h: on each one's own grid of blocks) and its padding, so
// no block mixes two parameters' magnitudes. Each block gets
// scale = absmax / qmax in fp32 (qmax 127 for 8 bits, 7 for 4) and each element the integer x / scale
// rounded to nearest, ties to even, so that it dequantizes to within scale / 2 of x (and a few fp32 ulps).
// The elements keep their places whatever the blocks: 8 bits, a byte an element; 4 bits, element 2i in
// the low nibble of byte i, 2i + 1 in the high one, two's complement, the high nibble of an odd n's last
// byte 0. A block of zeros has scale 0 and dequantizes to 0. A NaN or inf makes its block's scale NaN or
// inf and its integers 0, so the whole block dequantizes to NaN: the step's non-finite check sees it,
// where a clamp would hide it. cpu and cuda give the same bits (kernels/quantize_blocks.h) but for NaN
// payloads. T is float or bf16; q holds quantized_size(n, f.bits, blocks.blocks).payload_bytes bytes and
// scales blocks.blocks floats.
using cpu::BlockTable;
using cpu::QuantFormat;
template <class T>
void quantize_blocks(Device d, int8_t* q, float* scales, const T* x, size_t n, QuantFormat f, BlockTable blocks);
// out = the dequantized values, or, when `accumulate`, out += them, added in fp32 and rounded to T once (an
// owner summing the chunks it receives).
template <class T>
void dequantize_blocks(Device d, T* out, const int8_t* q, const float* scales, size_t n, QuantFormat f,
                       BlockTable blocks, bool accumulate);

// A chunk's block table, built on the host from where its pieces begin: 0, then each later piece's first
// element, ascending, then the chunk's length. entries() is what a device copy holds (the pieces' starts,
// then their first blocks' indices), in one array so that one copy moves it.
class HostBlockTable {
 public:
  HostBlockTable(const std::vector<int64_t>& piece_begin, QuantFormat f);
  int pieces() const { return pieces_; }
  size_t blocks() const { return size_t(entries_.back()); }
  size_t numel() const { return size_t(entries_[size_t(pieces_)]); }
  const std::vector<int64_t>& entries() const { return entries_; }
  BlockTable host_table() const { return table_at(entries_.data()); }
  // The table read from `copy`, a copy of entries() in another memory (the device's).
  BlockTable table_at(const int64_t* copy) const {
    return {copy, copy + pieces_ + 1, pieces_, block_, blocks()};
  }

 private:
  std::vector<int64_t> entries_;
  int pieces_;
  int block_;
};

// The size of n quantized elements in `blocks` blocks, for buffers and communication accounting. In one
// buffer the scales follow the payload at scales_offset(), aligned for float.
struct QuantizedSize {
  size_t payload_bytes;
  size_t scale_count;
  size_t scales_offset() const { return (payload_bytes + alignof(float) - 1) / alignof(float) * alignof(float); }
  size_t bytes() const { return scales_offset() + scale_count * sizeof(float); }
};
QuantizedSize quantized_size(size_t n, int bits, size_t blocks);
// n elements in one piece: ceil(n / f.block) blocks.
QuantizedSize quantized_size(size_t n, QuantFormat f);

// Blocks the host until every op queued on the device has finished (nothing to do on cpu). Timers go
// through here.
void synchronize(Device d);
// Copies `bytes` of results at src, in d's memory, to the host, once the device has finished everything
// queued before them: how the host reads what the device computed. Each call and each synchronize() is a
// wait for the device, which ZSHARD_TEST_COUNT_DEVICE_WAITS counts (kernels/test_hooks.h), on cpu too.
void read_back(Device d, void* host, const void* src, size_t bytes);

}  // namespace zshard::ops
