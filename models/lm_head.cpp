#include "models/lm_head.h"

#include <algorithm>

#include <zshard/ops.h>

namespace zshard {

template <class T>
double LmHead::forward(T* logits, T* losses, const T* x, const T* W, const int32_t* targets, bool backward,
                       float dloss, double* loss_sum) const {
  const int Vp = logits_row_stride(V);
  ops::gemm(device, false, true, N, V, C, 1.0f, x, C, W, C, 0.0f, logits, Vp);
  return ops::cross_entropy_forward_backward(device, backward ? logits : nullptr, losses, logits, targets, N, V,
                                             Vp, dloss, loss_sum);
}

template <class T>
void LmHead::input_grad(T* dx, const T* dlogits, const T* W) const {
  ops::gemm(device, false, false, N, C, V, 1.0f, dlogits, logits_row_stride(V), W, C, 0.0f, dx, C);
}

template <class T>
void LmHead::weight_grad(T* dW, const T* dlogits, const T* x) const {
  ops::gemm(device, true, false, V, C, N, 1.0f, dlogits, logits_row_stride(V), x, C, 1.0f, dW, C);
}

#define ZS_INSTANTIATE(T)                                                                                  \
  template double LmHead::forward<T>(T*, T*, const T*, const T*, const int32_t*, bool, float, double*) const; \
  template void LmHead::input_grad<T>(T*, const T*, const T*) const;                                       \
  template void LmHead::weight_grad<T>(T*, const T*, const T*) const;
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(double)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

bool defers_head_gradient(HeadGradient when, int B, int T, int channels) {
  if (when == HeadGradient::by_tokens) return int64_t(B) * T < channels;
  return when == HeadGradient::deferred;
}

BufferList LogitsRegion::logits_list(int B, int T, int vocab, DType dtype) {
  return [this, B, T, vocab, dtype](const BufferVisitor& f) { f(logits, {B, T, logits_row_stride(vocab)}, dtype); };
}

void LogitsRegion::visit_logits_region(int B, int T, int vocab, DType dtype, bool deferred,
                                       const BufferList& transients, const BufferVisitor& f) {
  const int64_t transient_elements = buffer_elements(transients);
  if (deferred) {
    logits_list(B, T, vocab, dtype)(f);
    f(shared, {transient_elements}, dtype);
  } else {
    f(shared, {std::max(buffer_elements(logits_list(B, T, vocab, dtype)), transient_elements)}, dtype);
  }
}

void LogitsRegion::cut_logits_region(int B, int T, int vocab, DType dtype, bool deferred,
                                     const BufferList& transients) {
  deferred_head = deferred;
  if (!deferred) cut_buffers(shared, logits_list(B, T, vocab, dtype));
  cut_buffers(shared, transients);
}

}  // namespace zshard
