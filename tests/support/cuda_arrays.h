// What the CUDA op tests share (tests/unit/test_cuda_ops.cpp, test_cuda_fused.cpp): random inputs that T
// holds exactly, device arrays of T filled from and read back as floats, and the comparison with the CPU.
// For CUDA builds only.
//
// Tolerances, as max_rel_diff (max abs error over the reference's max abs value):
// - fp32: 1e-5. Both sides compute in fp32; only summation order and libm-vs-CUDA math differ.
// - bf16: kBf16Tolerance = 3e-2. Inputs are rounded to bf16 first and the CPU reference runs in fp32 on
//   those same values, so input rounding is shared. The GPU then rounds outputs and the intermediates it
//   stores in T (attention scores, probabilities and score gradients) to an 8-bit mantissa, unit
//   roundoff 2^-8 ~ 4e-3; a few such roundings in a chain give ~1e-2. An indexing bug gives O(1). What
//   stays fp32 is held to fp32 (LayerNorm mean/rstd, the loss sum) or to one rounding (dwte).
#pragma once
#include <gtest/gtest.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <random>
#include <type_traits>
#include <vector>

#include "kernels/cuda/runtime.h"
#include "tests/support/gpu_test.h"
#include "tests/support/test_support.h"

namespace zshard::cuda::arrays {

using Vec = std::vector<float>;
inline constexpr double kF32Tolerance = 1e-5;
inline constexpr double kBf16Tolerance = 3e-2;

template <class T>
constexpr double tolerance() {
  return std::is_same_v<T, float> ? kF32Tolerance : kBf16Tolerance;
}

inline float to_float(float x) { return x; }
inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return __float2bfloat16(x);
}

// The values T can hold: what both sides of a comparison start from.
template <class T>
Vec rounded(Vec x) {
  for (float& e : x) e = to_float(from_float<T>(e));
  return x;
}

inline Vec zeros(size_t n) { return Vec(n, 0.f); }

template <class T>
Vec random_vec(size_t n, std::mt19937& rng, float lo = -2.f, float hi = 2.f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec x(n);
  for (float& e : x) e = dist(rng);
  return rounded<T>(x);
}

// A device array of T filled from floats; host() reads it back as floats.
template <class T>
class DeviceArray : public test::DeviceVector<T> {
 public:
  explicit DeviceArray(const Vec& host) : test::DeviceVector<T>(converted(host)) {}
  Vec host() const {
    const std::vector<T> exact = test::DeviceVector<T>::host();
    Vec out(exact.size());
    for (size_t i = 0; i < exact.size(); ++i) out[i] = to_float(exact[i]);
    return out;
  }

 private:
  static std::vector<T> converted(const Vec& host) {
    std::vector<T> exact(host.size());
    for (size_t i = 0; i < host.size(); ++i) exact[i] = from_float<T>(host[i]);
    return exact;
  }
};

inline void expect_close(const Vec& got, const Vec& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_LE(test::max_rel_diff(got, want), tol) << what;
}

// Which parameter gradients a check passes null on the GPU, as a frozen parameter's (bit i: the op's i-th
// parameter gradient): the GPU must still match the CPU's full op in every other gradient, dinp included.
using FrozenGrads = unsigned;
template <class T>
T* unless_frozen(FrozenGrads frozen, int i, const DeviceArray<T>& grad) {
  return frozen & (1u << i) ? nullptr : grad.get();
}
inline void expect_close_unless_frozen(FrozenGrads frozen, int i, const Vec& got, const Vec& want, double tol,
                                       const char* what) {
  if (!(frozen & (1u << i))) expect_close(got, want, tol, what);
}

}  // namespace zshard::cuda::arrays
