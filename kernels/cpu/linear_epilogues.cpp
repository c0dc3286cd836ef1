// The linear layer with its bias, a GELU after it and its bias gradients fused (<zshard/ops.h>'s
// linear_epilogue_forward and backward). In f32 and f64 these are linear_forward's, gelu_forward's and
// linear_backward's own operations in their order, so that a model gets the same bits fused or not. In bf16
// they round where cuBLASLt's epilogues (the CUDA twin, kernels/cuda/linear_epilogues.cu) do: the GEMM
// accumulates in fp32, the bias and the GELU (or its derivative) apply to that fp32 value, and the output
// and the kept pre-activation are each rounded once; a bias gradient is summed in fp32 from the unrounded
// values, rounded to bf16 (the type the epilogue writes it in) and then added to the gradient.
#include <vector>

#include <zshard/error.h>

#include "kernels/cpu/bf16_math.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

namespace zshard::cpu {

template <class T>
void linear_epilogue_forward(T* out, T* pre, const T* inp, const T* weight, const T* bias, int N, int C, int OC) {
  if (!pre) return linear_forward(out, inp, weight, bias, N, C, OC);
  linear_forward(pre, inp, weight, bias, N, C, OC);
  gelu_forward(out, pre, size_t(N) * OC);
}

template <class T>
void linear_epilogue_backward(T* dinp, T* dweight, T* dbias, T* pre_dbias, const T* dout, const T* inp, const T* pre,
                              const T* weight, int N, int C, int OC) {
  ZS_CHECK(dinp, "linear_epilogue_backward: dinp is required");
  gemm<T>(false, true, N, C, OC, T(1), dout, OC, weight, OC, T(0), dinp, C);  // dinp = dout @ W^T
  if (pre) {
    // gelu_backward's arithmetic on a zeroed dinp: 0 + grad * g, so that a -0 comes out +0 there too.
    for (size_t i = 0; i < size_t(N) * C; ++i) dinp[i] = T(0) + detail::gelu_grad(pre[i]) * dinp[i];
    if (pre_dbias) detail::add_column_sums(pre_dbias, dinp, N, C);
  }
  if (dweight) gemm<T>(true, false, C, OC, N, T(1), inp, C, dout, OC, T(1), dweight, OC);
  if (dbias) detail::add_column_sums(dbias, dout, N, OC);
}

template void linear_epilogue_forward<float>(float*, float*, const float*, const float*, const float*, int, int, int);
template void linear_epilogue_forward<double>(double*, double*, const double*, const double*, const double*, int, int,
                                              int);
template void linear_epilogue_backward<float>(float*, float*, float*, float*, const float*, const float*,
                                              const float*, const float*, int, int, int);
template void linear_epilogue_backward<double>(double*, double*, double*, double*, const double*, const double*,
                                               const double*, const double*, int, int, int);

namespace {

using bf16_math::Fp32;

// sums[c] += bf16(the fp32 sum of column c of x (rows, cols)): the epilogue's bias gradient, added once more.
void add_rounded_column_sums(bf16* sums, const float* x, int rows, int cols) {
  std::vector<float> column(size_t(cols), 0.f);
  detail::add_column_sums(column.data(), x, rows, cols);
  for (int c = 0; c < cols; ++c) sums[c] = bf16(float(sums[c]) + float(bf16(column[c])));
}

}  // namespace

template <>
void linear_epilogue_forward<bf16>(bf16* out, bf16* pre, const bf16* inp, const bf16* weight, const bf16* bias, int N,
                                   int C, int OC) {
  const size_t n = size_t(N) * OC;
  const Fp32 x(inp, size_t(N) * C), w(weight, size_t(C) * OC), acc(n);
  gemm<float>(false, false, N, OC, C, 1.f, x.get(), C, w.get(), OC, 0.f, acc.get(), OC);
  float* z = acc.get();
  if (bias)
    for (size_t i = 0; i < n; ++i) z[i] += float(bias[i % size_t(OC)]);
  if (pre)
    for (size_t i = 0; i < n; ++i) {
      pre[i] = bf16(z[i]);
      z[i] = detail::gelu(z[i]);
    }
  acc.round_into(out);
}

template <>
void linear_epilogue_backward<bf16>(bf16* dinp, bf16* dweight, bf16* dbias, bf16* pre_dbias, const bf16* dout,
                                    const bf16* inp, const bf16* pre, const bf16* weight, int N, int C, int OC) {
  ZS_CHECK(dinp, "linear_epilogue_backward: dinp is required");
  const Fp32 d(dout, size_t(N) * OC), w(weight, size_t(C) * OC), g(size_t(N) * C);
  gemm<float>(false, true, N, C, OC, 1.f, d.get(), OC, w.get(), OC, 0.f, g.get(), C);
  if (pre) {
    float* v = g.get();
    for (size_t i = 0; i < size_t(N) * C; ++i) v[i] *= detail::gelu_grad(float(pre[i]));
    if (pre_dbias) add_rounded_column_sums(pre_dbias, v, N, C);
  }
  g.round_into(dinp);
  if (dweight) gemm<bf16>(true, false, C, OC, N, 1.f, inp, C, dout, OC, 1.f, dweight, OC);
  if (dbias) add_rounded_column_sums(dbias, d.get(), N, OC);
}

}  // namespace zshard::cpu
