// Block quantization on the host: the reference the CUDA kernels are held to bit for bit, element by element
// in the order of kernels/quantize_blocks.h, each element's block found by the same lookup in the chunk's table.
#include <cmath>

#include "kernels/cpu/ops.h"
#include "kernels/quantize_blocks.h"

namespace zshard::cpu {

template <class T>
void quantize_blocks(int8_t* q, float* scales, const T* x, size_t n, QuantFormat f, BlockTable blocks) {
  if (n == 0) return;  // whatever the table says: nothing to read, as on the device
  for (size_t b = 0; b < blocks.blocks; ++b) {
    const quant::ElementRange range = quant::block_elements(blocks, b);
    float absmax = 0.f;
    for (size_t i = range.begin; i < range.end; ++i) absmax = quant::nan_max(absmax, std::fabs(float(x[i])));
    scales[b] = quant::block_scale(absmax, f.bits);
  }
  const auto value = [&](size_t i) {
    return quant::quantize_value(float(x[i]), scales[quant::block_of(blocks, i)], f.bits);
  };
  for (size_t j = 0; j < quant::payload_bytes(n, f.bits); ++j) q[j] = quant::payload_byte(j, n, f.bits, value);
}

template <class T>
void dequantize_blocks(T* out, const int8_t* q, const float* scales, size_t n, QuantFormat f, BlockTable blocks,
                       bool accumulate) {
  for (size_t i = 0; i < n; ++i) {
    const float v = quant::dequantize_value(q, scales[quant::block_of(blocks, i)], i, f.bits);
    out[i] = T(accumulate ? quant::add_rn(float(out[i]), v) : v);
  }
}

#define ZS_INSTANTIATE(T)                                                                            \
  template void quantize_blocks<T>(int8_t*, float*, const T*, size_t, QuantFormat, BlockTable);     \
  template void dequantize_blocks<T>(T*, const int8_t*, const float*, size_t, QuantFormat, BlockTable, bool);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

}  // namespace zshard::cpu
