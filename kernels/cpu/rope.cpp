// Rotary position embedding, Hugging Face's rotate_half layout: in each head, element i pairs with
// element i + HS/2 and the pair turns by angle t * f(i) at position t (f: kernels/rope_frequencies.h). A
// rotation's transpose is the rotation by minus the angle, so the backward is the same op turning the
// other way.
#include <cmath>
#include <cstddef>
#include <vector>

#include <zshard/error.h>

#include "kernels/cpu/ops.h"
#include "kernels/rope_frequencies.h"

namespace zshard::cpu {

namespace {

// direction +1: forward, -1: backward (in place on the gradient).
template <class T>
void rotate(T* x, int B, int Tn, int NH, int HS, const ops::RopeFrequencies& freq, int direction) {
  ZS_CHECK(HS % 2 == 0, "rope: the head size must be even, got ", HS);
  const int half = HS / 2;
  // Angles in double whatever T is, then rounded once: Hugging Face's float32 angles differ from these
  // only by rounding, and the CUDA twin computes the same double angles.
  std::vector<double> inv_freq(half);
  for (int i = 0; i < half; ++i) inv_freq[i] = rope::inv_freq(freq, i, HS);
  std::vector<T> cos_t(half), sin_t(half);
  for (int t = 0; t < Tn; ++t) {
    for (int i = 0; i < half; ++i) {
      cos_t[i] = T(std::cos(t * inv_freq[i]));
      sin_t[i] = T(direction * std::sin(t * inv_freq[i]));
    }
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < NH; ++h) {
        T* v = x + ((size_t(b) * Tn + t) * NH + h) * HS;
        for (int i = 0; i < half; ++i) {
          const T a = v[i], c = v[i + half];
          v[i] = a * cos_t[i] - c * sin_t[i];
          v[i + half] = c * cos_t[i] + a * sin_t[i];
        }
      }
    }
  }
}

}  // namespace

template <class T>
void rope_forward(T* x, int B, int Tn, int NH, int HS, const ops::RopeFrequencies& freq) {
  rotate(x, B, Tn, NH, HS, freq, +1);
}

template <class T>
void rope_backward(T* dx, int B, int Tn, int NH, int HS, const ops::RopeFrequencies& freq) {
  rotate(dx, B, Tn, NH, HS, freq, -1);
}

#define ZS_INSTANTIATE(T)                                                \
  template void rope_forward<T>(T*, int, int, int, int, const ops::RopeFrequencies&);  \
  template void rope_backward<T>(T*, int, int, int, int, const ops::RopeFrequencies&);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(double)
#undef ZS_INSTANTIATE

}  // namespace zshard::cpu
