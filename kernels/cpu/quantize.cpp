// Block quantization on the host: the reference the CUDA kernels are held to bit for bit, element by element
// in the order of kernels/quantize_blocks.h.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/ops.h"
#include "kernels/quantize_blocks.h"

namespace zshard::cpu {

template <class T>
void quantize_blocks(int8_t* q, float* scales, const T* x, size_t n, QuantFormat f) {
  const size_t block = size_t(f.block);
  for (size_t begin = 0; begin < n; begin += block) {
    float absmax = 0.f;
    for (size_t i = begin; i < std::min(n, begin + block); ++i)
      absmax = quant::nan_max(absmax, std::fabs(float(x[i])));
    scales[begin / block] = quant::block_scale(absmax, f.bits);
  }
  const auto value = [&](size_t i) { return quant::quantize_value(float(x[i]), scales[i / block], f.bits); };
  for (size_t j = 0; j < quant::payload_bytes(n, f.bits); ++j) q[j] = quant::payload_byte(j, n, f.bits, value);
}

template <class T>
void dequantize_blocks(T* out, const int8_t* q, const float* scales, size_t n, QuantFormat f, bool accumulate) {
  for (size_t i = 0; i < n; ++i) {
    const float v = quant::dequantize_value(q, scales, i, f);
    out[i] = T(accumulate ? quant::add_rn(float(out[i]), v) : v);
  }
}

#define ZS_INSTANTIATE(T)                                                                  \
  template void quantize_blocks<T>(int8_t*, float*, const T*, size_t, QuantFormat);       \
  template void dequantize_blocks<T>(T*, const int8_t*, const float*, size_t, QuantFormat, bool);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

}  // namespace zshard::cpu
