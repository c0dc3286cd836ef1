// Internal helpers for the CPU ops: loop bodies that GCC auto-vectorises without -ffast-math
// (std::exp is a libm call, and floating-point reductions need reassociation).
#pragma once
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace zshard::cpu::detail {

// sum over i in [0, n) of load(i), accumulated in Acc with independent partial sums that the compiler
// may keep in vector registers. The rounding differs from a sequential loop by a few ulp.
template <class Acc, class Load>
inline Acc lane_sum(size_t n, Load load) {
  constexpr size_t kLanes = 8;
  Acc acc[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (size_t l = 0; l < kLanes; ++l) acc[l] += load(i + l);
  for (; i < n; ++i) acc[0] += load(i);
  Acc sum = 0;
  for (Acc a : acc) sum += a;
  return sum;
}

template <class T>
inline T sum_of(const T* x, size_t n) {
  return lane_sum<T>(n, [x](size_t i) { return x[i]; });
}

// exp(x) for x <= 0 (softmax arguments after subtracting the row max), within about 1 ulp of std::exp
// where the result is a normal float, 0 below -87.5 (and for -inf); NaN stays NaN.
// exp(x) = 2^n exp(r) with n = round(x / ln2), |r| <= ln2/2, exp(r) by its Taylor series to degree 7
// (remainder (ln2/2)^8/8! ~ 5e-9); n is rounded by the magic-constant trick and 2^n is built from bits.
inline float exp_nonpositive(float x) {
  constexpr float kMin = -87.5f;                 // keeps 2^n normal; exp(x) is denormal below ~-87.34
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;         // few mantissa bits, so n * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRoundMagic = 12582912.0f;     // 1.5 * 2^23
  // Range test and selects in integer arithmetic on the bit patterns (for negative x a larger unsigned
  // pattern is a more negative number): a float compare, or float code under a condition, may trap, so
  // under the default -ftrapping-math the compiler would branch and not vectorise.
  const uint32_t x_bits = std::bit_cast<uint32_t>(x), min_bits = std::bit_cast<uint32_t>(kMin);
  const uint32_t below = uint32_t(x_bits > min_bits) & uint32_t(x_bits <= 0xff800000u);  // NaNs are above -inf
  const uint32_t keep = below - 1;  // all ones when x >= kMin or NaN, else 0
  const float xc = std::bit_cast<float>((x_bits & keep) | (min_bits & ~keep));
  const float shifted = xc * kLog2e + kRoundMagic;  // n sits in the low mantissa bits
  const float n = shifted - kRoundMagic;
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.f / 5040.f;  // Horner, 1/k! from k = 7 down
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const int32_t n_int = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRoundMagic);
  const float scale = std::bit_cast<float>((n_int + 127) << 23);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(p * scale) & keep);
}

// tanh(u) = sign(u) (1 - e) / (1 + e) with e = exp(-2|u|) <= 1. Absolute error below 3e-7, relative
// error larger for |u| << 1 where 1 - e cancels: meant for GELU, which adds tanh to 1.
inline float tanh_approx(float u) {
  const uint32_t bits = std::bit_cast<uint32_t>(u), sign = bits & 0x80000000u;
  const float e = exp_nonpositive(-2.f * std::bit_cast<float>(bits ^ sign));
  return std::bit_cast<float>(std::bit_cast<uint32_t>((1.f - e) / (1.f + e)) | sign);
}

// Double is the precision of the finite-difference tests, not of training: libm.
inline double exp_nonpositive(double x) { return std::exp(x); }
inline double tanh_approx(double u) { return std::tanh(u); }

// GELU, tanh approximation (Hugging Face "gelu_new"), and its derivative: one formula for the separate ops
// and the fused linear layer, so that both give the same bits.
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kGeluCubic = 0.044715;
template <class T>
inline T gelu(T x) {
  const T s = T(kSqrt2OverPi), a = T(kGeluCubic);
  return T(0.5) * x * (T(1) + tanh_approx(s * (x + a * x * x * x)));
}
template <class T>
inline T gelu_grad(T x) {
  const T s = T(kSqrt2OverPi), a = T(kGeluCubic);
  const T th = tanh_approx(s * (x + a * x * x * x));
  const T sech2 = T(1) - th * th;
  return T(0.5) * (T(1) + th) + T(0.5) * x * sech2 * s * (T(1) + T(3) * a * x * x);
}

// sums[c] += x[r * cols + c], row after row: a bias gradient, added in the same order wherever it is taken.
template <class T>
inline void add_column_sums(T* sums, const T* x, int rows, int cols) {
  for (int r = 0; r < rows; ++r) {
    const T* row = x + size_t(r) * cols;
    for (int c = 0; c < cols; ++c) sums[c] += row[c];
  }
}

}  // namespace zshard::cpu::detail
