// The fused forms of the model ops (<zshard/ops.h>: the linear layer with its epilogues, the residual add
// inside a norm), dispatched as kernels/ops.cpp dispatches the others.
#include <zshard/ops.h>

#include "kernels/op_dispatch.h"

namespace zshard::ops {

using namespace dispatch;

template <class T>
void layernorm_residual_forward(Device d, T* residual, T* out, NormStat<T>* mean, NormStat<T>* rstd, const T* a,
                                const T* b, const T* weight, const T* bias, int N, int C) {
  if (on_cpu<T>(d, "layernorm_residual_forward")) {
    ZS_ON_CPU(T, cpu::layernorm_residual_forward(residual, out, mean, rstd, a, b, weight, bias, N, C))
  } else {
    ZS_ON_CUDA(T, cuda::layernorm_residual_forward(dev(residual), dev(out), mean, rstd, dev(a), dev(b), dev(weight),
                                                   dev(bias), N, C))
  }
}

template <class T>
void rmsnorm_residual_forward(Device d, T* residual, T* out, NormStat<T>* rstd, const T* a, const T* b,
                              const T* weight, int N, int C, float eps) {
  if (on_cpu<T>(d, "rmsnorm_residual_forward")) {
    ZS_ON_CPU(T, cpu::rmsnorm_residual_forward(residual, out, rstd, a, b, weight, N, C, eps))
  } else {
    ZS_ON_CUDA(T, cuda::rmsnorm_residual_forward(dev(residual), dev(out), rstd, dev(a), dev(b), dev(weight), N, C,
                                                 eps))
  }
}

template <class T>
void linear_epilogue_forward(Device d, T* out, T* pre, const T* inp, const T* weight, const T* bias, int N, int C,
                             int OC) {
  if (on_cpu<T>(d, "linear_epilogue_forward")) {
    ZS_ON_CPU(T, cpu::linear_epilogue_forward(out, pre, inp, weight, bias, N, C, OC))
  } else {
    ZS_ON_CUDA(T, cuda::linear_epilogue_forward(dev(out), dev(pre), dev(inp), dev(weight), dev(bias), N, C, OC))
  }
}

template <class T>
void linear_epilogue_backward(Device d, T* dinp, T* dweight, T* dbias, T* pre_dbias, const T* dout, const T* inp,
                              const T* pre, const T* weight, int N, int C, int OC) {
  if (on_cpu<T>(d, "linear_epilogue_backward")) {
    ZS_ON_CPU(T, cpu::linear_epilogue_backward(dinp, dweight, dbias, pre_dbias, dout, inp, pre, weight, N, C, OC))
  } else {
    ZS_ON_CUDA(T, cuda::linear_epilogue_backward(dev(dinp), dev(dweight), dev(dbias), dev(pre_dbias), dev(dout),
                                                 dev(inp), dev(pre), dev(weight), N, C, OC))
  }
}

#define ZS_INSTANTIATE(T)                                                                                      \
  template void layernorm_residual_forward<T>(Device, T*, T*, NormStat<T>*, NormStat<T>*, const T*, const T*,  \
                                              const T*, const T*, int, int);                                   \
  template void rmsnorm_residual_forward<T>(Device, T*, T*, NormStat<T>*, const T*, const T*, const T*, int, int, \
                                            float);                                                            \
  template void linear_epilogue_forward<T>(Device, T*, T*, const T*, const T*, const T*, int, int, int);       \
  template void linear_epilogue_backward<T>(Device, T*, T*, T*, T*, const T*, const T*, const T*, const T*, int, \
                                            int, int);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(double)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

}  // namespace zshard::ops
