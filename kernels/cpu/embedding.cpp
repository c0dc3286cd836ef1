// Token + position embedding (the position table is optional: Llama has none). A null gradient (a frozen
// table, or none) gets nothing.
#include <algorithm>
#include <cstddef>

#include <zshard/error.h>

#include "kernels/cpu/ops.h"

namespace zshard::cpu {

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int Tn, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < Tn; ++t) {
      const int32_t token = tokens[size_t(b) * Tn + t];
      ZS_CHECK(token >= 0, "embedding: negative token ", token);
      const T* e = wte + size_t(token) * C;
      T* o = out + (size_t(b) * Tn + t) * C;
      if (!wpe) {
        std::copy(e, e + C, o);
        continue;
      }
      const T* p = wpe + size_t(t) * C;
      for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
    }
  }
}

template <class T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int Tn, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < Tn; ++t) {
      const T* d = dout + (size_t(b) * Tn + t) * C;
      if (dwte) {
        T* de = dwte + size_t(tokens[size_t(b) * Tn + t]) * C;
        for (int c = 0; c < C; ++c) de[c] += d[c];
      }
      if (!dwpe) continue;
      T* dp = dwpe + size_t(t) * C;
      for (int c = 0; c < C; ++c) dp[c] += d[c];
    }
  }
}

#define ZS_INSTANTIATE(T)                                                                               \
  template void embedding_forward<T>(T*, const int32_t*, const T*, const T*, int, int, int);            \
  template void embedding_backward<T>(T*, T*, const T*, const int32_t*, int, int, int);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(double)
#undef ZS_INSTANTIATE

}  // namespace zshard::cpu
