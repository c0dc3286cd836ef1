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
using bf16_math::in_blocks;

// A bias gradient's fp32 column sums over the row blocks of an (N, cols) matrix, then added to the bf16
// gradient once, rounded to bf16 first: the epilogue's bias gradient, added once more. Null: no gradient.
class RoundedColumnSums {
 public:
  RoundedColumnSums(bf16* gradient, int cols) : gradient_(gradient), sums_(gradient ? size_t(cols) : 0, 0.f) {}
  void add(const float* x, size_t rows) {
    if (gradient_) detail::add_column_sums(sums_.data(), x, int(rows), int(sums_.size()));
  }
  void add_to_gradient() const {
    for (size_t c = 0; c < sums_.size(); ++c) gradient_[c] = bf16(float(gradient_[c]) + float(bf16(sums_[c])));
  }

 private:
  bf16* gradient_;
  std::vector<float> sums_;
};

}  // namespace

namespace {
size_t row_bytes(int C, int OC) { return size_t(C + OC) * sizeof(float); }  // a row's input and output
}  // namespace

// The rows go in blocks whose fp32 copies fit kOpScratchBytes; the weight is copied once, and kept through
// the backward's weight gradient.
int64_t bf16_linear_epilogue_scratch_bytes(int N, int C, int OC) {
  const int64_t weight = int64_t(C) * OC * int64_t(sizeof(float));
  return weight + std::max(bf16_math::block_bytes(size_t(N), row_bytes(C, OC)), bf16_gemm_scratch_bytes(C, OC, N));
}

template <>
void linear_epilogue_forward<bf16>(bf16* out, bf16* pre, const bf16* inp, const bf16* weight, const bf16* bias, int N,
                                   int C, int OC) {
  const Fp32 w(weight, size_t(C) * OC);
  in_blocks(size_t(N), row_bytes(C, OC), [&](size_t first, size_t rows) {
    const size_t n = rows * OC, at = first * OC;
    const Fp32 x(inp + first * C, rows * C), acc(n);
    gemm<float>(false, false, int(rows), OC, C, 1.f, x.get(), C, w.get(), OC, 0.f, acc.get(), OC);
    float* z = acc.get();
    if (bias)
      for (size_t i = 0; i < n; ++i) z[i] += float(bias[i % size_t(OC)]);
    if (pre)
      for (size_t i = 0; i < n; ++i) {
        pre[at + i] = bf16(z[i]);
        z[i] = detail::gelu(z[i]);
      }
    acc.round_into(out + at);
  });
}

template <>
void linear_epilogue_backward<bf16>(bf16* dinp, bf16* dweight, bf16* dbias, bf16* pre_dbias, const bf16* dout,
                                    const bf16* inp, const bf16* pre, const bf16* weight, int N, int C, int OC) {
  ZS_CHECK(dinp, "linear_epilogue_backward: dinp is required");
  const Fp32 w(weight, size_t(C) * OC);
  RoundedColumnSums pre_bias_grad(pre ? pre_dbias : nullptr, C), bias_grad(dbias, OC);
  in_blocks(size_t(N), row_bytes(C, OC), [&](size_t first, size_t rows) {
    const size_t at = first * C;
    const Fp32 d(dout + first * OC, rows * OC), g(rows * C);
    gemm<float>(false, true, int(rows), C, OC, 1.f, d.get(), OC, w.get(), OC, 0.f, g.get(), C);
    if (pre) {
      float* v = g.get();
      for (size_t i = 0; i < rows * C; ++i) v[i] *= detail::gelu_grad(float(pre[at + i]));
      pre_bias_grad.add(v, rows);
    }
    g.round_into(dinp + at);
    bias_grad.add(d.get(), rows);
  });
  pre_bias_grad.add_to_gradient();
  if (dweight) gemm<bf16>(true, false, C, OC, N, 1.f, inp, C, dout, OC, 1.f, dweight, OC);
  bias_grad.add_to_gradient();
}

}  // namespace zshard::cpu
