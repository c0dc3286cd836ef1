#include "models/gpt2_layers.h"

#include "kernels/cpu/ops.h"

namespace zshard::gpt2 {

namespace {

// Every op the model runs is called from here and nowhere else, so the CUDA path (kernels/cuda, the
// same signatures) adds its device dispatch in one place.
template <class T>
struct Ops {
  static void embedding_forward(auto... args) { cpu::embedding_forward<T>(args...); }
  static void embedding_backward(auto... args) { cpu::embedding_backward<T>(args...); }
  static void layernorm_forward(auto... args) { cpu::layernorm_forward<T>(args...); }
  static void layernorm_backward(auto... args) { cpu::layernorm_backward<T>(args...); }
  static void linear_forward(auto... args) { cpu::linear_forward<T>(args...); }
  static void linear_backward(auto... args) { cpu::linear_backward<T>(args...); }
  static void attention_forward(auto... args) { cpu::attention_forward<T>(args...); }
  static void attention_backward(auto... args) { cpu::attention_backward<T>(args...); }
  static void gelu_forward(auto... args) { cpu::gelu_forward<T>(args...); }
  static void gelu_backward(auto... args) { cpu::gelu_backward<T>(args...); }
  static void residual_forward(auto... args) { cpu::residual_forward<T>(args...); }
  static void gemm(auto... args) { cpu::gemm<T>(args...); }
  static double cross_entropy_forward_backward(auto... args) {
    return cpu::cross_entropy_forward_backward<T>(args...);
  }
};

// The one description of the activation layout: calls f(tensor, shape) for every buffer, in order.
template <class F>
void for_each_buffer(Activations& a, const GPT2Config& c, int B, int T, F&& f) {
  const int64_t L = c.layers, C = c.dim, NH = c.heads, V = c.vocab;
  f(a.encoded, {B, T, C});
  f(a.ln1, {L, B, T, C});
  f(a.ln1_mean, {L, B, T});
  f(a.ln1_rstd, {L, B, T});
  f(a.qkv, {L, B, T, 3 * C});
  f(a.att, {L, B, NH, T, T});
  f(a.atty, {L, B, T, C});
  f(a.residual2, {L, B, T, C});
  f(a.ln2, {L, B, T, C});
  f(a.ln2_mean, {L, B, T});
  f(a.ln2_rstd, {L, B, T});
  f(a.fch, {L, B, T, 4 * C});
  f(a.fch_gelu, {L, B, T, 4 * C});
  f(a.residual3, {L, B, T, C});
  f(a.lnf, {B, T, C});
  f(a.lnf_mean, {B, T});
  f(a.lnf_rstd, {B, T});
  f(a.logits, {B, T, V});
  f(a.losses, {B, T});
  f(a.proj, {B, T, C});
  f(a.dresidual, {B, T, C});
  f(a.dln, {B, T, C});
  f(a.datty, {B, T, C});
  f(a.dqkv, {B, T, 3 * C});
  f(a.dfch, {B, T, 4 * C});
  f(a.dfch_gelu, {B, T, 4 * C});
}

// Layer l's slice of a per-block buffer.
template <class T>
T* at(const Tensor& t, int l) {
  return t.data<T>() + int64_t(l) * (t.numel() / t.dim(0));
}

// The residual stream entering block l (l == L: leaving the last block).
template <class T>
T* block_input(const Activations& a, int l) {
  return l == 0 ? a.encoded.data<T>() : at<T>(a.residual3, l - 1);
}

}  // namespace

int64_t Activations::bytes(const GPT2Config& c, int B, int T, DType dtype) {
  Activations unused;
  int64_t numel = 0;
  for_each_buffer(unused, c, B, T, [&](Tensor&, const Shape& shape) { numel += shape_numel(shape); });
  return numel * int64_t(dtype_size(dtype));
}

void Activations::allocate(const GPT2Config& c, int b, int t, DType type, Device dev) {
  B = b;
  T = t;
  dtype = type;
  device = dev;
  storage = Tensor::empty({bytes(c, B, T, dtype) / int64_t(dtype_size(dtype))}, dtype, device,
                          Category::activations);
  int64_t offset = 0;
  for_each_buffer(*this, c, B, T, [&](Tensor& t, const Shape& shape) {
    t = storage.view(offset, shape);
    offset += shape_numel(shape);
  });
}

template <class T>
void Layers<T>::embedding_forward(const int32_t* tokens, const UnitTensors& p) const {
  Ops<T>::embedding_forward(a.encoded.data<T>(), tokens, p[kWte].data<T>(), p[kWpe].data<T>(), a.B, a.T,
                            c.dim);
}

template <class T>
void Layers<T>::embedding_backward(const int32_t* tokens, const UnitTensors& g) const {
  Ops<T>::embedding_backward(g[kWte].data<T>(), g[kWpe].data<T>(), a.dresidual.data<T>(), tokens, a.B, a.T,
                             c.dim);
}

template <class T>
void Layers<T>::block_forward(int l, const UnitTensors& p) const {
  const int B = a.B, Tn = a.T, N = B * Tn, C = c.dim, NH = c.heads;
  const size_t NC = size_t(N) * C;
  const auto w = [&](BlockParam i) { return p[i].data<T>(); };
  const T* residual = block_input<T>(a, l);
  T* ln1 = at<T>(a.ln1, l);
  T* qkv = at<T>(a.qkv, l);
  T* atty = at<T>(a.atty, l);
  T* residual2 = at<T>(a.residual2, l);
  T* ln2 = at<T>(a.ln2, l);
  T* fch = at<T>(a.fch, l);
  T* fch_gelu = at<T>(a.fch_gelu, l);
  T* proj = a.proj.data<T>();

  // x = x + c_proj(attn(ln_1(x)))
  Ops<T>::layernorm_forward(ln1, at<T>(a.ln1_mean, l), at<T>(a.ln1_rstd, l), residual, w(kLn1Weight),
                            w(kLn1Bias), N, C);
  Ops<T>::linear_forward(qkv, ln1, w(kAttnWeight), w(kAttnBias), N, C, 3 * C);
  Ops<T>::attention_forward(atty, at<T>(a.att, l), qkv, B, Tn, C, NH);
  Ops<T>::linear_forward(proj, atty, w(kAttnProjWeight), w(kAttnProjBias), N, C, C);
  Ops<T>::residual_forward(residual2, residual, proj, NC);
  // x = x + c_proj(gelu(c_fc(ln_2(x))))
  Ops<T>::layernorm_forward(ln2, at<T>(a.ln2_mean, l), at<T>(a.ln2_rstd, l), residual2, w(kLn2Weight),
                            w(kLn2Bias), N, C);
  Ops<T>::linear_forward(fch, ln2, w(kFcWeight), w(kFcBias), N, C, 4 * C);
  Ops<T>::gelu_forward(fch_gelu, fch, 4 * NC);
  Ops<T>::linear_forward(proj, fch_gelu, w(kFcProjWeight), w(kFcProjBias), N, 4 * C, C);
  Ops<T>::residual_forward(at<T>(a.residual3, l), residual2, proj, NC);
}

template <class T>
void Layers<T>::block_backward(int l, const UnitTensors& p, const UnitTensors& g) const {
  const int B = a.B, Tn = a.T, N = B * Tn, C = c.dim, NH = c.heads;
  const size_t NC = size_t(N) * C;
  const auto w = [&](BlockParam i) { return p[i].data<T>(); };
  const auto dw = [&](BlockParam i) { return g[i].data<T>(); };
  // A residual add passes its output gradient to both inputs unchanged, so dresidual serves as the
  // c_proj output gradient as it is, and the LayerNorm backwards accumulate the branch into it.
  T* dresidual = a.dresidual.data<T>();
  T* dln = a.dln.data<T>();
  T* datty = a.datty.data<T>();
  T* dqkv = a.dqkv.data<T>();
  T* dfch = a.dfch.data<T>();
  T* dfch_gelu = a.dfch_gelu.data<T>();

  // MLP branch. The ops accumulate into activation gradients too, so each scratch is zeroed first.
  a.dfch_gelu.zero_();
  Ops<T>::linear_backward(dfch_gelu, dw(kFcProjWeight), dw(kFcProjBias), dresidual, at<T>(a.fch_gelu, l),
                          w(kFcProjWeight), N, 4 * C, C);
  a.dfch.zero_();
  Ops<T>::gelu_backward(dfch, at<T>(a.fch, l), dfch_gelu, 4 * NC);
  a.dln.zero_();
  Ops<T>::linear_backward(dln, dw(kFcWeight), dw(kFcBias), dfch, at<T>(a.ln2, l), w(kFcWeight), N, C, 4 * C);
  Ops<T>::layernorm_backward(dresidual, dw(kLn2Weight), dw(kLn2Bias), dln, at<T>(a.residual2, l),
                             w(kLn2Weight), at<T>(a.ln2_mean, l), at<T>(a.ln2_rstd, l), N, C);
  // Attention branch.
  a.datty.zero_();
  Ops<T>::linear_backward(datty, dw(kAttnProjWeight), dw(kAttnProjBias), dresidual, at<T>(a.atty, l),
                          w(kAttnProjWeight), N, C, C);
  a.dqkv.zero_();
  Ops<T>::attention_backward(dqkv, datty, at<T>(a.qkv, l), at<T>(a.att, l), B, Tn, C, NH);
  a.dln.zero_();
  Ops<T>::linear_backward(dln, dw(kAttnWeight), dw(kAttnBias), dqkv, at<T>(a.ln1, l), w(kAttnWeight), N, C,
                          3 * C);
  Ops<T>::layernorm_backward(dresidual, dw(kLn1Weight), dw(kLn1Bias), dln, block_input<T>(a, l),
                             w(kLn1Weight), at<T>(a.ln1_mean, l), at<T>(a.ln1_rstd, l), N, C);
}

template <class T>
void Layers<T>::final_norm_forward(const UnitTensors& p) const {
  Ops<T>::layernorm_forward(a.lnf.data<T>(), a.lnf_mean.data<T>(), a.lnf_rstd.data<T>(),
                            block_input<T>(a, c.layers), p[kLnfWeight].data<T>(), p[kLnfBias].data<T>(),
                            a.B * a.T, c.dim);
}

template <class T>
void Layers<T>::final_norm_backward(const UnitTensors& p, const UnitTensors& g) const {
  a.dresidual.zero_();
  Ops<T>::layernorm_backward(a.dresidual.data<T>(), g[kLnfWeight].data<T>(), g[kLnfBias].data<T>(),
                             a.dln.data<T>(), block_input<T>(a, c.layers), p[kLnfWeight].data<T>(),
                             a.lnf_mean.data<T>(), a.lnf_rstd.data<T>(), a.B * a.T, c.dim);
}

template <class T>
double Layers<T>::head_forward(const Tensor& wte, const int32_t* targets, bool backward, T dloss) const {
  const int N = a.B * a.T, C = c.dim, V = c.vocab;
  T* logits = a.logits.data<T>();
  // wte is (V, C): logits = lnf @ wte^T.
  Ops<T>::gemm(false, true, N, V, C, T(1), a.lnf.data<T>(), C, wte.data<T>(), C, T(0), logits, V);
  T* dlogits = backward ? logits : nullptr;
  return Ops<T>::cross_entropy_forward_backward(dlogits, a.losses.data<T>(), logits, targets, N, V, dloss);
}

template <class T>
void Layers<T>::head_backward(const Tensor& wte, const Tensor& dwte) const {
  const int N = a.B * a.T, C = c.dim, V = c.vocab;
  const T* dlogits = a.logits.data<T>();
  Ops<T>::gemm(false, false, N, C, V, T(1), dlogits, V, wte.data<T>(), C, T(0), a.dln.data<T>(), C);
  Ops<T>::gemm(true, false, V, C, N, T(1), dlogits, V, a.lnf.data<T>(), C, T(1), dwte.data<T>(), C);
}

template struct Layers<float>;
template struct Layers<double>;

}  // namespace zshard::gpt2
