// Internal helpers for the CPU ops: loop bodies that GCC/Clang auto-vectorise without -ffast-math.
// (std::exp is a libm call and floating-point reductions need reassociation, so neither vectorises
// in a plain loop.)
#pragma once
#include <bit>
#include <cstddef>
#include <cstdint>

namespace zshard::cpu::detail {

// A reduction over i in [0, n) with independent partial accumulators: the compiler may then keep
// them in vector registers. The result's rounding differs from a sequential sum by a few ulp.
template <class Acc, class Load, class Combine>
inline Acc lane_reduce(size_t n, Acc init, Load load, Combine combine) {
  constexpr size_t kLanes = 8;
  Acc acc[kLanes];
  for (Acc& a : acc) a = init;
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (size_t l = 0; l < kLanes; ++l) acc[l] = combine(acc[l], load(i + l));
  for (; i < n; ++i) acc[0] = combine(acc[0], load(i));
  Acc result = acc[0];
  for (size_t l = 1; l < kLanes; ++l) result = combine(result, acc[l]);
  return result;
}

template <class T>
inline T max_of(const T* x, size_t n) {
  return lane_reduce(n, x[0], [x](size_t i) { return x[i]; }, [](T a, T b) { return a < b ? b : a; });
}

template <class T>
inline T sum_of(const T* x, size_t n) {
  return lane_reduce(n, T(0), [x](size_t i) { return x[i]; }, [](T a, T b) { return a + b; });
}

template <class T>
struct ExpTraits;
template <>
struct ExpTraits<float> {
  using Bits = int32_t;
  static constexpr float kMin = -87.0f;                  // exp(-87) is near the smallest normal float
  static constexpr float kLn2Hi = 0.693359375f;           // few mantissa bits: n * kLn2Hi is exact
  static constexpr float kLn2Lo = -2.12194440e-4f;
  static constexpr float kRoundMagic = 12582912.0f;       // 1.5 * 2^23
  static constexpr int kMantissaBits = 23, kExponentBias = 127;
  static constexpr int kDegree = 7;                       // Taylor remainder (ln2/2)^8/8! ~ 5e-9
};
template <>
struct ExpTraits<double> {
  using Bits = int64_t;
  static constexpr double kMin = -708.0;
  static constexpr double kLn2Hi = 6.93147180369123816490e-01;
  static constexpr double kLn2Lo = 1.90821492927058770002e-10;
  static constexpr double kRoundMagic = 6755399441055744.0;  // 1.5 * 2^52
  static constexpr int kMantissaBits = 52, kExponentBias = 1023;
  static constexpr int kDegree = 13;                         // (ln2/2)^14/14! ~ 4e-18
};

// exp(x) for x <= 0 (softmax arguments after subtracting the row max), within a few ulp of std::exp;
// 0 below ExpTraits::kMin, NaN stays NaN. exp(x) = 2^n exp(r), n = round(x / ln2), |r| <= ln2/2,
// with the rounding done by the magic-constant trick and 2^n built from its exponent bits.
template <class T>
inline T exp_nonpositive(T x) {
  using K = ExpTraits<T>;
  using Bits = typename K::Bits;
  constexpr T kLog2e = T(1.44269504088896340736);
  const T xc = x < K::kMin ? K::kMin : x;
  const T shifted = xc * kLog2e + K::kRoundMagic;  // n sits in the low mantissa bits
  const T n = shifted - K::kRoundMagic;
  const T r = (xc - n * K::kLn2Hi) - n * K::kLn2Lo;
  T p = T(1);
  for (int k = K::kDegree; k >= 1; --k) p = T(1) + p * r / T(k);  // Horner on the Taylor series
  const Bits n_bits = std::bit_cast<Bits>(shifted) - std::bit_cast<Bits>(K::kRoundMagic);
  const T scale = std::bit_cast<T>(Bits((n_bits + K::kExponentBias) << K::kMantissaBits));
  return x < K::kMin ? T(0) : p * scale;
}

}  // namespace zshard::cpu::detail
