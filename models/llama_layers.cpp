#include "models/llama_layers.h"

#include "kernels/device_memory.h"
#include "models/model_support.h"

namespace zshard::llama {

namespace {

// The layers' intermediates in the compute dtype, S slots each. Their RMSNorm statistics (another dtype,
// few bytes) are listed with what is kept.
void visit_intermediates(Activations& a, const LlamaConfig& c, int B, int T, int64_t S, DType dtype,
                         AttentionKernel kernel, const BufferVisitor& f) {
  a.visit_attention(B, T, c.dim, c.heads, S, dtype, kernel, f);
  for (Tensor* t : {&a.gate, &a.up, &a.swiglu}) f(*t, {S, B, T, c.ffn_dim}, dtype);
  c.lora_plan().visit_hidden(a.lora_hidden, B, T, S, dtype, f);
}

}  // namespace

// Projections before they are packed or added, the backward's scratch and, with recomputation, the one
// slot of intermediates.
BufferList Activations::transients(const LlamaConfig& c, int B, int T, DType dtype, Recompute mode,
                                   AttentionKernel kernel) {
  return [this, &c, B, T, dtype, mode, kernel](const BufferVisitor& f) {
    const int64_t C = c.dim, KV = c.kv_dim(), F = c.ffn_dim;
    if (mode == Recompute::blocks) visit_intermediates(*this, c, B, T, 1, dtype, kernel, f);
    const auto g = [&](Tensor& t, const Shape& shape) { f(t, shape, dtype); };
    for (Tensor* t : {&proj, &q, &dq, &datty}) g(*t, {B, T, C});
    for (Tensor* t : {&k, &v, &dk, &dv}) g(*t, {B, T, KV});
    g(dqkv, {B, T, 3 * C});
    for (Tensor* t : {&dswiglu, &dgate, &dup}) g(*t, {B, T, F});
  };
}

BufferList Activations::kept(const LlamaConfig& c, int B, int T, DType dtype, Recompute mode, AttentionKernel kernel) {
  return [this, &c, B, T, dtype, mode, kernel](const BufferVisitor& f) {
    const int64_t S = slots(mode, c.layers);
    const DType stat = ops::norm_stat_dtype(dtype);
    for (Tensor* t : {&ln1_rstd, &ln2_rstd}) f(*t, {S, B, T}, stat);
    f(lnf_rstd, {B, T}, stat);
    visit_attention_stats(B, T, c.heads, S, dtype, kernel, f);
    if (mode == Recompute::none) visit_intermediates(*this, c, B, T, S, dtype, kernel, f);
  };
}

template <class T>
void Layers<T>::embedding_forward(const UnitTensors& p) const {
  ops::embedding_forward<T>(a.device, a.encoded.data<T>(), a.inputs.data<int32_t>(), p[kEmbed].data<T>(), nullptr,
                            a.B, a.T, c.dim);
}

template <class T>
void Layers<T>::embedding_backward(const UnitTensors& g) const {
  ops::embedding_backward<T>(a.device, g[kEmbed].data<T>(), nullptr, a.dresidual.data<T>(),
                             a.inputs.data<int32_t>(), a.B, a.T, c.dim);
}

template <class T>
void Layers<T>::linear_forward(LayerLinear m, int s, const UnitTensors& p, T* y, const T* x, int C, int OC) const {
  const T* W = p[kLinearWeight[m]].data<T>();
  const int adapter = lora.adapter(m), N = a.B * a.T;
  if (adapter < 0) return ops::gemm(a.device, false, true, N, OC, C, 1.0f, x, C, W, C, 0.0f, y, OC);
  ops::lora_linear_forward<T>(a.device, y, slice<T>(a.lora_hidden[m], s), x, W, nullptr, p[adapter].data<T>(),
                              p[adapter + 1].data<T>(), N, C, OC, lora.rank(), lora.scale(), lora.layout());
}

// dx += dy @ W (dx = with `first` and the fused ops) and dW += dy^T @ x, dW skipped when frozen.
template <class T>
void Layers<T>::linear_backward(LayerLinear m, int s, const UnitTensors& p, const UnitTensors& g, Tensor& dx,
                                const T* dy, const T* x, int C, int OC, bool first) const {
  const T* W = p[kLinearWeight[m]].data<T>();
  const int adapter = lora.adapter(m), N = a.B * a.T;
  const Device d = a.device;
  const bool set = first && fused && adapter < 0;
  if (first && !set) dx.zero_();
  if (adapter >= 0)
    return ops::lora_linear_backward(d, dx.data<T>(), g[adapter].data<T>(), g[adapter + 1].data<T>(),
                                     dy, x, W, p[adapter].data<T>(), p[adapter + 1].data<T>(),
                                     slice<T>(a.lora_hidden[m], s), N, C, OC, lora.rank(), lora.scale(), lora.layout());
  ops::gemm(d, false, false, N, C, OC, 1.0f, dy, OC, W, C, set ? 0.0f : 1.0f, dx.data<T>(), C);
  if (T* dW = g[kLinearWeight[m]].data<T>()) ops::gemm(d, true, false, OC, C, N, 1.0f, dy, OC, x, C, 1.0f, dW, C);
}

template <class T>
void Layers<T>::block_forward(int l, const UnitTensors& p) const {
  const int B = a.B, Tn = a.T, N = B * Tn, C = c.dim, NH = c.heads, NKV = c.kv_heads, HS = c.head_dim();
  const int s = a.slot(l);  // where this block's intermediates live
  const int KV = c.kv_dim(), F = c.ffn_dim;
  const size_t NC = size_t(N) * C;
  const Device d = a.device;
  const ops::RopeFrequencies rope = c.rope();
  const auto w = [&](LayerParam i) { return p[i].data<T>(); };
  const T* residual = a.block_input<T>(l);
  T* ln1 = slice<T>(a.ln1, s);
  T* qkv = slice<T>(a.qkv, s);
  T* atty = slice<T>(a.atty, s);
  T* residual2 = slice<T>(a.residual2, s);
  T* ln2 = slice<T>(a.ln2, s);
  T *q = a.q.data<T>(), *k = a.k.data<T>(), *v = a.v.data<T>(), *proj = a.proj.data<T>();

  // x = x + o_proj(attn(rope(q), rope(k), v)) on rmsnorm(x)
  ops::rmsnorm_forward(d, ln1, slice<Stat>(a.ln1_rstd, s), residual, w(kAttnNorm), N, C, kRmsNormEps);
  linear_forward(kQProj, s, p, q, ln1, C, C);
  linear_forward(kKProj, s, p, k, ln1, C, KV);
  linear_forward(kVProj, s, p, v, ln1, C, KV);
  ops::rope_forward(d, q, B, Tn, NH, HS, rope);
  ops::rope_forward(d, k, B, Tn, NKV, HS, rope);
  ops::gqa_pack(d, qkv, q, k, v, B, Tn, NH, NKV, HS);
  a.attention_forward<T>(s, C, NH);
  linear_forward(kOProj, s, p, proj, atty, C, C);
  // x = x + down(silu(gate(h)) * up(h)) with h = rmsnorm(x)
  if (fused) {
    ops::rmsnorm_residual_forward(d, residual2, ln2, slice<Stat>(a.ln2_rstd, s), residual, proj, w(kMlpNorm), N, C,
                                  kRmsNormEps);
  } else {
    ops::residual_forward(d, residual2, residual, proj, NC);
    ops::rmsnorm_forward(d, ln2, slice<Stat>(a.ln2_rstd, s), residual2, w(kMlpNorm), N, C, kRmsNormEps);
  }
  linear_forward(kGateProj, s, p, slice<T>(a.gate, s), ln2, C, F);
  linear_forward(kUpProj, s, p, slice<T>(a.up, s), ln2, C, F);
  ops::swiglu_forward(d, slice<T>(a.swiglu, s), slice<T>(a.gate, s), slice<T>(a.up, s), size_t(N) * F);
  linear_forward(kDownProj, s, p, proj, slice<T>(a.swiglu, s), F, C);
  // The layer's output is the next unit's input: the norm it feeds belongs to that unit, so this add stays.
  ops::residual_forward(d, slice<T>(a.residual3, l), residual2, proj, NC);
}

template <class T>
void Layers<T>::block_backward(int l, const UnitTensors& p, const UnitTensors& g) const {
  const int B = a.B, Tn = a.T, N = B * Tn, C = c.dim, NH = c.heads, NKV = c.kv_heads, HS = c.head_dim();
  const int s = a.slot(l);  // where this block's intermediates live
  const int KV = c.kv_dim(), F = c.ffn_dim;
  const Device d = a.device;
  const ops::RopeFrequencies rope = c.rope();
  const auto w = [&](LayerParam i) { return p[i].data<T>(); };
  const auto dw = [&](LayerParam i) { return g[i].data<T>(); };
  // dresidual is the gradient of both residual-add inputs; the RMSNorm backwards add the branches into it.
  T* dresidual = a.dresidual.data<T>();
  T* dln = a.dln.data<T>();

  // MLP branch. Each scratch's first contribution sets it (or zeroes it first: linear_backward's `first`).
  linear_backward(kDownProj, s, p, g, a.dswiglu, dresidual, slice<T>(a.swiglu, s), F, C, true);
  if (!fused) {
    a.dgate.zero_();
    a.dup.zero_();
  }
  ops::swiglu_backward(d, a.dgate.data<T>(), a.dup.data<T>(), a.dswiglu.data<T>(), slice<T>(a.gate, s),
                       slice<T>(a.up, s), size_t(N) * F, fused ? ops::InputGrad::set : ops::InputGrad::accumulate);
  linear_backward(kGateProj, s, p, g, a.dln, a.dgate.data<T>(), slice<T>(a.ln2, s), C, F, true);
  linear_backward(kUpProj, s, p, g, a.dln, a.dup.data<T>(), slice<T>(a.ln2, s), C, F, false);
  ops::rmsnorm_backward(d, dresidual, dw(kMlpNorm), dln, slice<T>(a.residual2, s), w(kMlpNorm),
                        slice<Stat>(a.ln2_rstd, s), N, C);
  // Attention branch. The attention backward zeroes dqkv first where it adds (blocks); the packing's
  // backward adds, into zeroed buffers.
  linear_backward(kOProj, s, p, g, a.datty, dresidual, slice<T>(a.atty, s), C, C, true);
  a.attention_backward(s, a.dqkv, a.datty.data<T>(), C, NH);
  a.dq.zero_();
  a.dk.zero_();
  a.dv.zero_();
  ops::gqa_pack_backward(d, a.dq.data<T>(), a.dk.data<T>(), a.dv.data<T>(), a.dqkv.data<T>(), B, Tn, NH, NKV, HS);
  ops::rope_backward(d, a.dq.data<T>(), B, Tn, NH, HS, rope);
  ops::rope_backward(d, a.dk.data<T>(), B, Tn, NKV, HS, rope);
  const T* ln1 = slice<T>(a.ln1, s);
  linear_backward(kQProj, s, p, g, a.dln, a.dq.data<T>(), ln1, C, C, true);
  linear_backward(kKProj, s, p, g, a.dln, a.dk.data<T>(), ln1, C, KV, false);
  linear_backward(kVProj, s, p, g, a.dln, a.dv.data<T>(), ln1, C, KV, false);
  ops::rmsnorm_backward(d, dresidual, dw(kAttnNorm), dln, a.block_input<T>(l), w(kAttnNorm),
                        slice<Stat>(a.ln1_rstd, s), N, C);
}

template <class T>
void Layers<T>::final_norm_forward(const UnitTensors& p) const {
  ops::rmsnorm_forward(a.device, a.lnf.data<T>(), a.lnf_rstd.data<Stat>(), a.block_input<T>(c.layers),
                       p[kFinalNorm].data<T>(), a.B * a.T, c.dim, kRmsNormEps);
}

template <class T>
void Layers<T>::final_norm_backward(const UnitTensors& p, const UnitTensors& g) const {
  a.dresidual.zero_();
  ops::rmsnorm_backward(a.device, a.dresidual.data<T>(), g[kFinalNorm].data<T>(), a.dln.data<T>(),
                        a.block_input<T>(c.layers), p[kFinalNorm].data<T>(), a.lnf_rstd.data<Stat>(), a.B * a.T,
                        c.dim);
}

template struct Layers<float>;
template struct Layers<double>;
template struct Layers<bf16>;

}  // namespace zshard::llama
