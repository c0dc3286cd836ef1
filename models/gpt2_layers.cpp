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
  ops::embedding_backward(a.device, g[kWte].data<T>(), g[kWpe].data<T>(), a.dresidual.data<T>(),
                          a.inputs.data<int32_t>(), a.B, a.T, c.dim);
}

template <class T>
void Layers<T>::linear_forward(BlockLinear m, int s, const UnitTensors& p, T* out, T* pre, const T* inp, int C,
                               int OC) const {
  const BlockParam w = kLinearWeight[m];
  const int adapter = lora.adapter(m), N = a.B * a.T;
  const T *W = p[w].data<T>(), *b = p[w + 1].data<T>();
  if (adapter < 0 && fused) return ops::linear_epilogue_forward(a.device, out, pre, inp, W, b, N, C, OC);
  T* y = pre ? pre : out;
  if (adapter < 0)
    ops::linear_forward(a.device, y, inp, W, b, N, C, OC);
  else
    ops::lora_linear_forward(a.device, y, slice<T>(a.lora_hidden[m], s), inp, W, b, p[adapter].data<T>(),
                             p[adapter + 1].data<T>(), N, C, OC, lora.rank(), lora.scale(), lora.layout());
  if (pre) ops::gelu_forward(a.device, out, pre, size_t(N) * OC);
}

template <class T>
void Layers<T>::linear_backward(BlockLinear m, int s, const UnitTensors& p, const UnitTensors& g, Tensor& dinp,
                                const T* dout, const T* inp, int C, int OC, bool with_bias) const {
  const BlockParam w = kLinearWeight[m];
  const int adapter = lora.adapter(m), N = a.B * a.T;
  T* dx = dinp.data<T>();
  T* dbias = with_bias ? g[w + 1].data<T>() : nullptr;
  if (adapter < 0 && fused)
    return ops::linear_epilogue_backward<T>(a.device, dx, g[w].data<T>(), dbias, nullptr, dout, inp, nullptr,
                                            p[w].data<T>(), N, C, OC);
  dinp.zero_();  // the ops below add
  if (adapter < 0)
    return ops::linear_backward(a.device, dx, g[w].data<T>(), dbias, dout, inp, p[w].data<T>(), N, C, OC);
  ops::lora_linear_backward(a.device, dx, g[adapter].data<T>(), g[adapter + 1].data<T>(), dout, inp,
                            p[w].data<T>(), p[adapter].data<T>(), p[adapter + 1].data<T>(),
                            slice<T>(a.lora_hidden[m], s), N, C, OC, lora.rank(), lora.scale(), lora.layout());
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
  Stat *ln2_mean = slice<Stat>(a.ln2_mean, s), *ln2_rstd = slice<Stat>(a.ln2_rstd, s);

  // x = x + c_proj(attn(ln_1(x)))
  ops::layernorm_forward(d, ln1, slice<Stat>(a.ln1_mean, s), slice<Stat>(a.ln1_rstd, s), residual, w(kLn1Weight),
                         w(kLn1Bias), N, C);
  linear_forward(kQkv, s, p, qkv, nullptr, ln1, C, 3 * C);
  a.attention_forward<T>(s, C, NH);
  linear_forward(kAttnOut, s, p, proj, nullptr, atty, C, C);
  // x = x + c_proj(gelu(c_fc(ln_2(x))))
  if (fused) {
    ops::layernorm_residual_forward(d, residual2, ln2, ln2_mean, ln2_rstd, residual, proj, w(kLn2Weight),
                                    w(kLn2Bias), N, C);
  } else {
    ops::residual_forward(d, residual2, residual, proj, NC);
    ops::layernorm_forward(d, ln2, ln2_mean, ln2_rstd, residual2, w(kLn2Weight), w(kLn2Bias), N, C);
  }
  linear_forward(kFc, s, p, fch_gelu, fch, ln2, C, 4 * C);
  linear_forward(kFcOut, s, p, proj, nullptr, fch_gelu, 4 * C, C);
  // The block's output is the next unit's input: the norm it feeds belongs to that unit, so this add stays.
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
  T* dqkv = a.dqkv.data<T>();
  T* dfch = a.dfch.data<T>();
  const T *fch = slice<T>(a.fch, s), *fch_gelu = slice<T>(a.fch_gelu, s);

  // MLP branch. The fused backward of c_proj goes on through the GELU into dfch and takes c_fc's bias
  // gradient on the way; otherwise c_proj's input gradient lands in dfch_gelu and the GELU's backward
  // follows.
  const bool through_gelu = fused && lora.adapter(kFcOut) < 0;
  if (through_gelu) {
    ops::linear_epilogue_backward(d, dfch, dw(kFcProjWeight), dw(kFcProjBias), dw(kFcBias), dresidual, fch_gelu,
                                  fch, w(kFcProjWeight), N, 4 * C, C);
  } else {
    linear_backward(kFcOut, s, p, g, a.dfch_gelu, dresidual, fch_gelu, 4 * C, C);
    a.dfch.zero_();
    ops::gelu_backward(d, dfch, fch, a.dfch_gelu.data<T>(), 4 * NC);
  }
  linear_backward(kFc, s, p, g, a.dln, dfch, slice<T>(a.ln2, s), C, 4 * C, !through_gelu);
  ops::layernorm_backward(d, dresidual, dw(kLn2Weight), dw(kLn2Bias), dln, slice<T>(a.residual2, s),
                          w(kLn2Weight), slice<Stat>(a.ln2_mean, s), slice<Stat>(a.ln2_rstd, s), N, C);
  // Attention branch. The attention backward zeroes dqkv first where it adds (blocks).
  linear_backward(kAttnOut, s, p, g, a.datty, dresidual, slice<T>(a.atty, s), C, C);
  a.attention_backward(s, a.dqkv, a.datty.data<T>(), C, NH);
  linear_backward(kQkv, s, p, g, a.dln, dqkv, slice<T>(a.ln1, s), C, 3 * C);
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
  ops::layernorm_backward(a.device, a.dresidual.data<T>(), g[kLnfWeight].data<T>(), g[kLnfBias].data<T>(),
                          a.dln.data<T>(), a.block_input<T>(c.layers), p[kLnfWeight].data<T>(),
                          a.lnf_mean.data<Stat>(), a.lnf_rstd.data<Stat>(), a.B * a.T, c.dim);
}

template struct Layers<float>;
template struct Layers<double>;
template struct Layers<bf16>;

}  // namespace zshard::gpt2
