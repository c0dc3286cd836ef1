// The arithmetic of block quantization (kernels/engine_ops.h's quantize_blocks), one definition compiled
// for the CPU reference (kernels/cpu/quantize.cpp) and for the CUDA kernels (kernels/cuda/quantize.cu),
// so that both give the same bits: the same fp32 operations in the same order, each rounded on its own.
// On the device the operations are the _rn intrinsics, which nvcc neither fuses into an FMA (it does fuse
// a plain a * b + c) nor replaces under -prec-div=false; only -ftz (--use_fast_math, which cmake/Cuda.cmake
// does not pass) would still change them, for subnormal values. The host has no FMA to fuse into at the
// baseline x86-64 target, and GCC does not contract in ISO C++ mode (CMAKE_CXX_EXTENSIONS OFF).
// Which elements share a scale is the chunk's block table's (cpu::BlockTable): the engine's pieces are the
// parameters a chunk holds and its padding, each cut into blocks from its own start, so that a block never
// spans two parameters; both sides find an element's block and a block's elements with the same lookups
// (block_of, block_elements), a binary search over the few pieces.
#pragma once
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/ops.h"

#include "kernels/host_device.h"

namespace zshard::quant {

using cpu::BlockTable;
using cpu::QuantFormat;

ZS_HOST_DEVICE inline int qmax(int bits) { return bits == 8 ? 127 : 7; }

ZS_HOST_DEVICE inline float div_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
ZS_HOST_DEVICE inline float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
ZS_HOST_DEVICE inline float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// The larger of two magnitudes, a NaN winning: fmaxf drops a NaN, which would leave a finite scale for a
// block holding one. Exact, so the order of a reduction does not change the result.
ZS_HOST_DEVICE inline float nan_max(float a, float b) { return (b > a || b != b) ? b : a; }

// absmax / qmax: 0 for a block of zeros, NaN or inf for a block holding a NaN or an inf.
ZS_HOST_DEVICE inline float block_scale(float absmax, int bits) { return div_rn(absmax, float(qmax(bits))); }

// x / scale rounded to nearest, ties to even: unbiased, where ties away from zero would inflate every tie's
// magnitude alike, a bias that summing many ranks' quantized gradients would add up. Ties are common:
// bf16 inputs have 8-bit significands. The clamp matters only for a subnormal scale, whose few bits can
// put x / scale past qmax. A zero or non-finite scale gives 0, which dequantizes to 0 and to NaN.
ZS_HOST_DEVICE inline int quantize_value(float x, float scale, int bits) {
  if (!(scale > 0.f && scale <= FLT_MAX)) return 0;
  const float limit = float(qmax(bits));
  return int(rintf(fminf(fmaxf(div_rn(x, scale), -limit), limit)));
}

// 4 bits: element 2i in the low nibble of byte i, 2i + 1 in the high nibble, each two's complement.
ZS_HOST_DEVICE inline int8_t pack_nibbles(int low, int high) { return int8_t((low & 0xf) | (high << 4)); }
ZS_HOST_DEVICE inline int unpack_nibble(int8_t byte, bool high) {
  return high ? byte >> 4 : int8_t(byte << 4) >> 4;
}

// Byte j of the payload: element j (8 bits), or elements 2j and 2j + 1 (4 bits; past n, a 0 nibble).
// value(i) is element i's integer.
template <class Value>
ZS_HOST_DEVICE int8_t payload_byte(size_t j, size_t n, int bits, Value value) {
  if (bits == 8) return int8_t(value(j));
  return pack_nibbles(value(2 * j), 2 * j + 1 < n ? value(2 * j + 1) : 0);
}
ZS_HOST_DEVICE inline size_t payload_bytes(size_t n, int bits) { return bits == 8 ? n : (n + 1) / 2; }

// Element i in fp32: its integer times its block's scale.
ZS_HOST_DEVICE inline float dequantize_value(const int8_t* q, float scale, size_t i, int bits) {
  const int v = bits == 8 ? q[i] : unpack_nibble(q[i / 2], i % 2);
  return mul_rn(float(v), scale);
}

// The last p of [0, count) with ascending[p] <= i, given ascending[0] <= i: a binary search, in as many
// steps as log2 of the pieces a chunk has (one per parameter it holds, and its padding).
ZS_HOST_DEVICE inline int last_at_or_below(const int64_t* ascending, int count, int64_t i) {
  int lo = 0, hi = count;
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (ascending[mid] <= i ? lo : hi) = mid;
  }
  return lo;
}

// Element i's block in table t.
ZS_HOST_DEVICE inline size_t block_of(const BlockTable& t, size_t i) {
  const int p = last_at_or_below(t.piece_begin, t.pieces, int64_t(i));
  return size_t(t.first_block[p]) + (i - size_t(t.piece_begin[p])) / size_t(t.block);
}

// Block b's elements in table t: [begin, end).
struct ElementRange {
  size_t begin, end;
};
ZS_HOST_DEVICE inline ElementRange block_elements(const BlockTable& t, size_t b) {
  const int p = last_at_or_below(t.first_block, t.pieces, int64_t(b));
  const size_t begin = size_t(t.piece_begin[p]) + (b - size_t(t.first_block[p])) * size_t(t.block);
  const size_t piece_end = size_t(t.piece_begin[p + 1]);
  return {begin, begin + size_t(t.block) < piece_end ? begin + size_t(t.block) : piece_end};
}

}  // namespace zshard::quant
