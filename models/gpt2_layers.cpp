#include "models/gpt2_layers.h"

#include <zshard/ops.h>

#include "kernels/device_memory.h"
#include "models/model_support.h"

namespace zshard::gpt2 {

namespace {

// The blocks' intermediates in the compute dtype, S slots each. Their LayerNorm statistics (another
// dtype, few bytes) are listed with what is kept.
void visit_intermediates(Activations& a, const GPT2Config& c, int B, int T, int64_t S, DType dtype,
                         AttentionKernel kernel, const BufferVisitor& f) {
  a.visit_attention(B, T, c.dim, c.heads, S, dtype, kernel, f);
  for (Tensor* t : {&a.fch, &a.fch_gelu}) f(*t, {S, B, T, 4 * int64_t(c.dim)}, dtype);
  c.lora_plan().visit_hidden(a.lora_hidden, B, T, S, dtype, f);
}

}  // namespace

// The c_proj output, the backward's scratch and, with recomputation, the one slot of intermediates.
BufferList Activations::transients(const GPT2Config& c, int B, int T, DType dtype, Recompute mode,
                                   AttentionKernel kernel) {
  return [this, &c, B, T, dtype, mode, kernel](const BufferVisitor& f) {
    const int64_t C = c.dim;
    if (mode == Recompute::blocks) visit_intermediates(*this, c, B, T, 1, dtype, kernel, f);
    const auto g = [&](Tensor& t, const Shape& shape) { f(t, shape, dtype); };
    g(proj, {B, T, C});
    g(datty, {B, T, C});
    g(dqkv, {B, T, 3 * C});
    g(dfch, {B, T, 4 * C});
    g(dfch_gelu, {B, T, 4 * C});
  };
}

BufferList Activations::kept(const GPT2Config& c, int B, int T, DType dtype, Recompute mode, AttentionKernel kernel) {
  return [this, &c, B, T, dtype, mode, kernel](const BufferVisitor& f) {
    const int64_t S = slots(mode, c.layers);
    const DType stat = ops::norm_stat_dtype(dtype);
    for (Tensor* t : {&ln1_mean, &ln1_rstd, &ln2_mean, &ln2_rstd}) f(*t, {S, B, T}, stat);
    for (Tensor* t : {&lnf_mean, &lnf_rstd}) f(*t, {B, T}, stat);
    visit_attention_stats(B, T, c.heads, S, dtype, kernel, f);
    if (mode == Recompute::none) visit_intermediates(*this, c, B, T, S, dtype, kernel, f);
  };
}

template <class T>
void Layers<T>::embedding_forward(const UnitTensors& p) const {
  ops::embedding_forward(a.device, a.encoded.data<T>(), a.inputs.data<int32_t>(), p[kWte].data<T>(),
                         p[kWpe].data<T>(), a.B, a.T, c.dim);
}

template <class T>
void Layers<T>::embedding_backward(const UnitTensors& g) const {
  ops::embedding_backward(a.device, grad_or_null<T>(g[kWte]), grad_or_null<T>(g[kWpe]), a.dresidual.data<T>(),
                          a.inputs.data<int32_t>(), a.B, a.T, c.dim);
}

template <class T>
void Layers<T>::linear_forward(BlockLinear m, int s, const UnitTensors& p, T* out, const T* inp, int C, int OC) const {
  const BlockParam w = kLinearWeight[m];
  const int adapter = lora.adapter(m), N = a.B * a.T;
  if (adapter < 0)
    return ops::linear_forward(a.device, out, inp, p[w].data<T>(), p[w + 1].data<T>(), N, C, OC);
  ops::lora_linear_forward(a.device, out, slice<T>(a.lora_hidden[m], s), inp, p[w].data<T>(), p[w + 1].data<T>(),
                           p[adapter].data<T>(), p[adapter + 1].data<T>(), N, C, OC, lora.rank(), lora.scale(),
                           lora.layout());
}

template <class T>
void Layers<T>::linear_backward(BlockLinear m, int s, const UnitTensors& p, const UnitTensors& g, T* dinp,
                                const T* dout, const T* inp, int C, int OC) const {
  const BlockParam w = kLinearWeight[m];
  const int adapter = lora.adapter(m), N = a.B * a.T;
  if (adapter < 0)
    return ops::linear_backward(a.device, dinp, grad_or_null<T>(g[w]), grad_or_null<T>(g[w + 1]), dout, inp,
                                p[w].data<T>(), N, C, OC);
  ops::lora_linear_backward(a.device, dinp, grad_or_null<T>(g[adapter]), grad_or_null<T>(g[adapter + 1]), dout, inp,
                            p[w].data<T>(), p[adapter].data<T>(), p[adapter + 1].data<T>(),
                            slice<T>(a.lora_hidden[m], s), N, C, OC, lora.rank(), lora.scale(),
                            lora.layout());
}

template <class T>
void Layers<T>::block_forward(int l, const UnitTensors& p) const {
  const int B = a.B, Tn = a.T, N = B * Tn, C = c.dim, NH = c.heads;
  const int s = a.slot(l);  // where this block's intermediates live
  const size_t NC = size_t(N) * C;
  const Device d = a.device;
  const auto w = [&](BlockParam i) { return p[i].data<T>(); };
  const T* residual = a.block_input<T>(l);
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
  linear_forward(kQkv, s, p, qkv, ln1, C, 3 * C);
  a.attention_forward<T>(s, C, NH);
  linear_forward(kAttnOut, s, p, proj, atty, C, C);
  ops::residual_forward(d, residual2, residual, proj, NC);
  // x = x + c_proj(gelu(c_fc(ln_2(x))))
  ops::layernorm_forward(d, ln2, slice<Stat>(a.ln2_mean, s), slice<Stat>(a.ln2_rstd, s), residual2, w(kLn2Weight),
                         w(kLn2Bias), N, C);
  linear_forward(kFc, s, p, fch, ln2, C, 4 * C);
  ops::gelu_forward(d, fch_gelu, fch, 4 * NC);
  linear_forward(kFcOut, s, p, proj, fch_gelu, 4 * C, C);
  ops::residual_forward(d, slice<T>(a.residual3, l), residual2, proj, NC);
}

template <class T>
void Layers<T>::block_backward(int l, const UnitTensors& p, const UnitTensors& g) const {
  const int B = a.B, Tn = a.T, N = B * Tn, C = c.dim, NH = c.heads;
  const int s = a.slot(l);  // where this block's intermediates live
  const size_t NC = size_t(N) * C;
  const Device d = a.device;
  const auto w = [&](BlockParam i) { return p[i].data<T>(); };
  const auto dw = [&](BlockParam i) { return grad_or_null<T>(g[i]); };
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
  linear_backward(kFcOut, s, p, g, dfch_gelu, dresidual, slice<T>(a.fch_gelu, s), 4 * C, C);
  a.dfch.zero_();
  ops::gelu_backward(d, dfch, slice<T>(a.fch, s), dfch_gelu, 4 * NC);
  a.dln.zero_();
  linear_backward(kFc, s, p, g, dln, dfch, slice<T>(a.ln2, s), C, 4 * C);
  ops::layernorm_backward(d, dresidual, dw(kLn2Weight), dw(kLn2Bias), dln, slice<T>(a.residual2, s),
                          w(kLn2Weight), slice<Stat>(a.ln2_mean, s), slice<Stat>(a.ln2_rstd, s), N, C);
  // Attention branch.
  a.datty.zero_();
  linear_backward(kAttnOut, s, p, g, datty, dresidual, slice<T>(a.atty, s), C, C);
  a.attention_backward(s, a.dqkv, datty, C, NH);
  a.dln.zero_();
  linear_backward(kQkv, s, p, g, dln, dqkv, slice<T>(a.ln1, s), C, 3 * C);
  ops::layernorm_backward(d, dresidual, dw(kLn1Weight), dw(kLn1Bias), dln, a.block_input<T>(l),
                          w(kLn1Weight), slice<Stat>(a.ln1_mean, s), slice<Stat>(a.ln1_rstd, s), N, C);
}

template <class T>
void Layers<T>::final_norm_forward(const UnitTensors& p) const {
  ops::layernorm_forward(a.device, a.lnf.data<T>(), a.lnf_mean.data<Stat>(), a.lnf_rstd.data<Stat>(),
                         a.block_input<T>(c.layers), p[kLnfWeight].data<T>(), p[kLnfBias].data<T>(),
                         a.B * a.T, c.dim);
}

template <class T>
void Layers<T>::final_norm_backward(const UnitTensors& p, const UnitTensors& g) const {
  a.dresidual.zero_();
  ops::layernorm_backward(a.device, a.dresidual.data<T>(), grad_or_null<T>(g[kLnfWeight]), grad_or_null<T>(g[kLnfBias]),
                          a.dln.data<T>(), a.block_input<T>(c.layers), p[kLnfWeight].data<T>(),
                          a.lnf_mean.data<Stat>(), a.lnf_rstd.data<Stat>(), a.B * a.T, c.dim);
}

template struct Layers<float>;
template struct Layers<double>;
template struct Layers<bf16>;

}  // namespace zshard::gpt2
