#include "models/gpt2_layers.h"

#include <zshard/ops.h>

#include "kernels/device_memory.h"
#include "models/model_support.h"

namespace zshard::gpt2 {

namespace {

// The blocks' intermediates in the compute dtype, S slots each. Their LayerNorm statistics (another
// dtype, few bytes) are listed with what is kept.
void visit_intermediates(Activations& a, const GPT2Config& c, int B, int T, int64_t S, DType dtype,
                         const BufferVisitor& f) {
  const int64_t C = c.dim, NH = c.heads;
  const auto g = [&](Tensor& t, const Shape& shape) { f(t, shape, dtype); };
  g(a.ln1, {S, B, T, C});
  g(a.qkv, {S, B, T, 3 * C});
  g(a.att, {S, B, NH, T, T});
  g(a.atty, {S, B, T, C});
  g(a.residual2, {S, B, T, C});
  g(a.ln2, {S, B, T, C});
  g(a.fch, {S, B, T, 4 * C});
  g(a.fch_gelu, {S, B, T, 4 * C});
}

// What lives only inside one block's forward or backward: the c_proj output, the backward's scratch and,
// with recomputation, the one slot of intermediates.
BufferList block_transients(Activations& a, const GPT2Config& c, int B, int T, DType dtype,
                            Recompute mode) {
  return [&a, &c, B, T, dtype, mode](const BufferVisitor& f) {
    const int64_t C = c.dim;
    if (mode == Recompute::blocks) visit_intermediates(a, c, B, T, 1, dtype, f);
    const auto g = [&](Tensor& t, const Shape& shape) { f(t, shape, dtype); };
    g(a.proj, {B, T, C});
    g(a.datty, {B, T, C});
    g(a.dqkv, {B, T, 3 * C});
    g(a.dfch, {B, T, 4 * C});
    g(a.dfch_gelu, {B, T, 4 * C});
  };
}

// The one description of the activation layout: calls f(tensor, shape, dtype) for every buffer, in
// order. The tokens are i32; everything else is in the compute dtype.
void for_each_buffer(Activations& a, const GPT2Config& c, int B, int T, DType dtype, Recompute mode,
                     bool deferred_head, const BufferVisitor& f) {
  const int64_t L = c.layers, S = Activations::slots(mode, c.layers), C = c.dim;
  f(a.inputs, {B, T}, DType::i32);
  f(a.targets, {B, T}, DType::i32);
  const auto g = [&](Tensor& t, const Shape& shape) { f(t, shape, dtype); };
  const auto stat = [&](Tensor& t, const Shape& shape) { f(t, shape, ops::norm_stat_dtype(dtype)); };
  g(a.encoded, {B, T, C});
  for (Tensor* t : {&a.ln1_mean, &a.ln1_rstd, &a.ln2_mean, &a.ln2_rstd}) stat(*t, {S, B, T});
  if (mode == Recompute::none) visit_intermediates(a, c, B, T, L, dtype, f);
  g(a.residual3, {L, B, T, C});
  g(a.lnf, {B, T, C});
  stat(a.lnf_mean, {B, T});
  stat(a.lnf_rstd, {B, T});
  g(a.losses, {B, T});
  g(a.dresidual, {B, T, C});
  g(a.dln, {B, T, C});
  // The logits live from the head's forward to its backward, while no block runs; deferred, the dlogits
  // live on to the embedding's backward.
  a.visit_logits_region(B, T, c.vocab, dtype, deferred_head, block_transients(a, c, B, T, dtype, mode), f);
}

// The residual stream entering block l (l == L: leaving the last block).
template <class T>
T* block_input(const Activations& a, int l) {
  return l == 0 ? a.encoded.data<T>() : slice<T>(a.residual3, l - 1);
}

}  // namespace

int64_t Activations::bytes(const GPT2Config& c, int B, int T, DType dtype, Recompute mode,
                           bool deferred_head) {
  Activations unused;
  return buffer_bytes(
      [&](const BufferVisitor& f) { for_each_buffer(unused, c, B, T, dtype, mode, deferred_head, f); });
}

void Activations::allocate(const GPT2Config& c, int b, int t, DType type, Device dev, Recompute mode,
                           bool deferred) {
  BatchBuffers::allocate(b, t, type, dev, mode, [&](const BufferVisitor& f) {
    for_each_buffer(*this, c, b, t, type, mode, deferred, f);
  });
  cut_logits_region(b, t, c.vocab, type, deferred, block_transients(*this, c, b, t, type, mode));
}

template <class T>
void Layers<T>::embedding_forward(const UnitTensors& p) const {
  ops::embedding_forward(a.device, a.encoded.data<T>(), a.inputs.data<int32_t>(), p[kWte].data<T>(),
                         p[kWpe].data<T>(), a.B, a.T, c.dim);
}

template <class T>
void Layers<T>::embedding_backward(const UnitTensors& g) const {
  ops::embedding_backward(a.device, g[kWte].data<T>(), g[kWpe].data<T>(), a.dresidual.data<T>(),
                          a.inputs.data<int32_t>(), a.B, a.T, c.dim);
}

template <class T>
void Layers<T>::block_forward(int l, const UnitTensors& p) const {
  const int B = a.B, Tn = a.T, N = B * Tn, C = c.dim, NH = c.heads;
  const int s = a.slot(l);  // where this block's intermediates live
  const size_t NC = size_t(N) * C;
  const Device d = a.device;
  const auto w = [&](BlockParam i) { return p[i].data<T>(); };
  const T* residual = block_input<T>(a, l);
  T* ln1 = slice<T>(a.ln1, s);
  T* qkv = slice<T>(a.qkv, s);
  T* atty = slice<T>(a.atty, s);
  T* residual2 = slice<T>(a.residual2, s);
  T* ln2 = slice<T>(a.ln2, s);
  T* fch = slice<T>(a.fch, s);
  T* fch_gelu = slice<T>(a.fch_gelu, s);
  T* proj = a.proj.data<T>();

  // x = x + c_proj(attn(ln_1(x)))
  ops::layernorm_forward(d, ln1, slice<Stat>(a.ln1_mean, s), slice<Stat>(a.ln1_rstd, s), residual, w(kLn1Weight),
                         w(kLn1Bias), N, C);
  ops::linear_forward(d, qkv, ln1, w(kAttnWeight), w(kAttnBias), N, C, 3 * C);
  ops::attention_forward(d, atty, slice<T>(a.att, s), qkv, B, Tn, C, NH);
  ops::linear_forward(d, proj, atty, w(kAttnProjWeight), w(kAttnProjBias), N, C, C);
  ops::residual_forward(d, residual2, residual, proj, NC);
  // x = x + c_proj(gelu(c_fc(ln_2(x))))
  ops::layernorm_forward(d, ln2, slice<Stat>(a.ln2_mean, s), slice<Stat>(a.ln2_rstd, s), residual2, w(kLn2Weight),
                         w(kLn2Bias), N, C);
  ops::linear_forward(d, fch, ln2, w(kFcWeight), w(kFcBias), N, C, 4 * C);
  ops::gelu_forward(d, fch_gelu, fch, 4 * NC);
  ops::linear_forward(d, proj, fch_gelu, w(kFcProjWeight), w(kFcProjBias), N, 4 * C, C);
  ops::residual_forward(d, slice<T>(a.residual3, l), residual2, proj, NC);
}

template <class T>
void Layers<T>::block_backward(int l, const UnitTensors& p, const UnitTensors& g) const {
  const int B = a.B, Tn = a.T, N = B * Tn, C = c.dim, NH = c.heads;
  const int s = a.slot(l);  // where this block's intermediates live
  const size_t NC = size_t(N) * C;
  const Device d = a.device;
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
  ops::linear_backward(d, dfch_gelu, dw(kFcProjWeight), dw(kFcProjBias), dresidual, slice<T>(a.fch_gelu, s),
                       w(kFcProjWeight), N, 4 * C, C);
  a.dfch.zero_();
  ops::gelu_backward(d, dfch, slice<T>(a.fch, s), dfch_gelu, 4 * NC);
  a.dln.zero_();
  ops::linear_backward(d, dln, dw(kFcWeight), dw(kFcBias), dfch, slice<T>(a.ln2, s), w(kFcWeight), N, C,
                       4 * C);
  ops::layernorm_backward(d, dresidual, dw(kLn2Weight), dw(kLn2Bias), dln, slice<T>(a.residual2, s),
                          w(kLn2Weight), slice<Stat>(a.ln2_mean, s), slice<Stat>(a.ln2_rstd, s), N, C);
  // Attention branch.
  a.datty.zero_();
  ops::linear_backward(d, datty, dw(kAttnProjWeight), dw(kAttnProjBias), dresidual, slice<T>(a.atty, s),
                       w(kAttnProjWeight), N, C, C);
  a.dqkv.zero_();
  ops::attention_backward(d, dqkv, datty, slice<T>(a.qkv, s), slice<T>(a.att, s), B, Tn, C, NH);
  a.dln.zero_();
  ops::linear_backward(d, dln, dw(kAttnWeight), dw(kAttnBias), dqkv, slice<T>(a.ln1, s), w(kAttnWeight), N, C,
                       3 * C);
  ops::layernorm_backward(d, dresidual, dw(kLn1Weight), dw(kLn1Bias), dln, block_input<T>(a, l),
                          w(kLn1Weight), slice<Stat>(a.ln1_mean, s), slice<Stat>(a.ln1_rstd, s), N, C);
}

template <class T>
void Layers<T>::final_norm_forward(const UnitTensors& p) const {
  ops::layernorm_forward(a.device, a.lnf.data<T>(), a.lnf_mean.data<Stat>(), a.lnf_rstd.data<Stat>(),
                         block_input<T>(a, c.layers), p[kLnfWeight].data<T>(), p[kLnfBias].data<T>(),
                         a.B * a.T, c.dim);
}

template <class T>
void Layers<T>::final_norm_backward(const UnitTensors& p, const UnitTensors& g) const {
  a.dresidual.zero_();
  ops::layernorm_backward(a.device, a.dresidual.data<T>(), g[kLnfWeight].data<T>(), g[kLnfBias].data<T>(),
                          a.dln.data<T>(), block_input<T>(a, c.layers), p[kLnfWeight].data<T>(),
                          a.lnf_mean.data<Stat>(), a.lnf_rstd.data<Stat>(), a.B * a.T, c.dim);
}

template struct Layers<float>;
template struct Layers<double>;
template struct Layers<bf16>;

}  // namespace zshard::gpt2
