#include "models/llama_layers.h"

#include "kernels/device_memory.h"
#include "models/model_support.h"

namespace zshard::llama {

namespace {

// The layers' intermediates in the compute dtype, S slots each. Their RMSNorm statistics (another dtype,
// few bytes) are listed with what is kept.
void visit_intermediates(Activations& a, const LlamaConfig& c, int B, int T, int64_t S, DType dtype,
                         const BufferVisitor& f) {
  const int64_t C = c.dim, NH = c.heads, F = c.ffn_dim;
  const auto g = [&](Tensor& t, const Shape& shape) { f(t, shape, dtype); };
  g(a.ln1, {S, B, T, C});
  g(a.qkv, {S, B, T, 3 * C});
  g(a.att, {S, B, NH, T, T});
  g(a.atty, {S, B, T, C});
  g(a.residual2, {S, B, T, C});
  g(a.ln2, {S, B, T, C});
  for (Tensor* t : {&a.gate, &a.up, &a.swiglu}) g(*t, {S, B, T, F});
}

// What lives only inside one layer's forward or backward: projections before they are packed or added,
// the backward's scratch and, with recomputation, the one slot of intermediates.
BufferList layer_transients(Activations& a, const LlamaConfig& c, int B, int T, DType dtype,
                            Recompute mode) {
  return [&a, &c, B, T, dtype, mode](const BufferVisitor& f) {
    const int64_t C = c.dim, KV = c.kv_dim(), F = c.ffn_dim;
    if (mode == Recompute::blocks) visit_intermediates(a, c, B, T, 1, dtype, f);
    const auto g = [&](Tensor& t, const Shape& shape) { f(t, shape, dtype); };
    for (Tensor* t : {&a.proj, &a.q, &a.dq, &a.datty}) g(*t, {B, T, C});
    for (Tensor* t : {&a.k, &a.v, &a.dk, &a.dv}) g(*t, {B, T, KV});
    g(a.dqkv, {B, T, 3 * C});
    for (Tensor* t : {&a.dswiglu, &a.dgate, &a.dup}) g(*t, {B, T, F});
  };
}

// The one description of the activation layout, in order: i32 tokens, the rest in the compute dtype and
// the RMSNorm statistics in NormStat.
void for_each_buffer(Activations& a, const LlamaConfig& c, int B, int T, DType dtype, Recompute mode,
                     bool deferred_head, const BufferVisitor& f) {
  const int64_t L = c.layers, S = Activations::slots(mode, c.layers), C = c.dim;
  f(a.inputs, {B, T}, DType::i32);
  f(a.targets, {B, T}, DType::i32);
  const auto g = [&](Tensor& t, const Shape& shape) { f(t, shape, dtype); };
  const auto stat = [&](Tensor& t, const Shape& shape) { f(t, shape, ops::norm_stat_dtype(dtype)); };
  g(a.encoded, {B, T, C});
  stat(a.ln1_rstd, {S, B, T});
  stat(a.ln2_rstd, {S, B, T});
  if (mode == Recompute::none) visit_intermediates(a, c, B, T, L, dtype, f);
  g(a.residual3, {L, B, T, C});
  g(a.lnf, {B, T, C});
  stat(a.lnf_rstd, {B, T});
  g(a.losses, {B, T});
  g(a.dresidual, {B, T, C});
  g(a.dln, {B, T, C});
  // The logits live from the head's forward to its backward, while no layer runs; a tied head's deferred
  // dlogits live on to the embedding's backward.
  a.visit_logits_region(B, T, c.vocab, dtype, deferred_head, layer_transients(a, c, B, T, dtype, mode), f);
}

// The residual stream entering layer l (l == L: leaving the last layer).
template <class T>
T* layer_input(const Activations& a, int l) {
  return l == 0 ? a.encoded.data<T>() : slice<T>(a.residual3, l - 1);
}

// y (N, OC) = x (N, C) @ W^T for W (OC, C), Hugging Face's nn.Linear layout.
template <class T>
void matmul_forward(Device d, T* y, const T* x, const T* W, int N, int C, int OC) {
  ops::gemm(d, false, true, N, OC, C, 1.0f, x, C, W, C, 0.0f, y, OC);
}

// dx += dy @ W and dW += dy^T @ x (the ops' convention: backward accumulates).
template <class T>
void matmul_backward(Device d, T* dx, T* dW, const T* dy, const T* x, const T* W, int N, int C, int OC) {
  ops::gemm(d, false, false, N, C, OC, 1.0f, dy, OC, W, C, 1.0f, dx, C);
  ops::gemm(d, true, false, OC, C, N, 1.0f, dy, OC, x, C, 1.0f, dW, C);
}

}  // namespace

int64_t Activations::bytes(const LlamaConfig& c, int B, int T, DType dtype, Recompute mode,
                           bool deferred_head) {
  Activations unused;
  return buffer_bytes(
      [&](const BufferVisitor& f) { for_each_buffer(unused, c, B, T, dtype, mode, deferred_head, f); });
}

void Activations::allocate(const LlamaConfig& c, int b, int t, DType type, Device dev, Recompute mode,
                           bool deferred) {
  BatchBuffers::allocate(b, t, type, dev, mode,
                         [&](const BufferVisitor& f) { for_each_buffer(*this, c, b, t, type, mode, deferred, f); });
  cut_logits_region(b, t, c.vocab, type, deferred, layer_transients(*this, c, b, t, type, mode));
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
void Layers<T>::layer_forward(int l, const UnitTensors& p) const {
  const int B = a.B, Tn = a.T, N = B * Tn, C = c.dim, NH = c.heads, NKV = c.kv_heads, HS = c.head_dim();
  const int s = a.slot(l);  // where this block's intermediates live
  const int KV = c.kv_dim(), F = c.ffn_dim;
  const size_t NC = size_t(N) * C;
  const Device d = a.device;
  const float theta = float(c.rope_theta);
  const auto w = [&](LayerParam i) { return p[i].data<T>(); };
  const T* residual = layer_input<T>(a, l);
  T* ln1 = slice<T>(a.ln1, s);
  T* qkv = slice<T>(a.qkv, s);
  T* atty = slice<T>(a.atty, s);
  T* residual2 = slice<T>(a.residual2, s);
  T* ln2 = slice<T>(a.ln2, s);
  T *q = a.q.data<T>(), *k = a.k.data<T>(), *v = a.v.data<T>(), *proj = a.proj.data<T>();

  // x = x + o_proj(attn(rope(q), rope(k), v)) on rmsnorm(x)
  ops::rmsnorm_forward(d, ln1, slice<Stat>(a.ln1_rstd, s), residual, w(kAttnNorm), N, C, kRmsNormEps);
  matmul_forward(d, q, ln1, w(kQ), N, C, C);
  matmul_forward(d, k, ln1, w(kK), N, C, KV);
  matmul_forward(d, v, ln1, w(kV), N, C, KV);
  ops::rope_forward(d, q, B, Tn, NH, HS, theta);
  ops::rope_forward(d, k, B, Tn, NKV, HS, theta);
  ops::gqa_pack(d, qkv, q, k, v, B, Tn, NH, NKV, HS);
  ops::attention_forward(d, atty, slice<T>(a.att, s), qkv, B, Tn, C, NH);
  matmul_forward(d, proj, atty, w(kO), N, C, C);
  ops::residual_forward(d, residual2, residual, proj, NC);
  // x = x + down(silu(gate(h)) * up(h)) with h = rmsnorm(x)
  ops::rmsnorm_forward(d, ln2, slice<Stat>(a.ln2_rstd, s), residual2, w(kMlpNorm), N, C, kRmsNormEps);
  matmul_forward(d, slice<T>(a.gate, s), ln2, w(kGate), N, C, F);
  matmul_forward(d, slice<T>(a.up, s), ln2, w(kUp), N, C, F);
  ops::swiglu_forward(d, slice<T>(a.swiglu, s), slice<T>(a.gate, s), slice<T>(a.up, s), size_t(N) * F);
  matmul_forward(d, proj, slice<T>(a.swiglu, s), w(kDown), N, F, C);
  ops::residual_forward(d, slice<T>(a.residual3, l), residual2, proj, NC);
}

template <class T>
void Layers<T>::layer_backward(int l, const UnitTensors& p, const UnitTensors& g) const {
  const int B = a.B, Tn = a.T, N = B * Tn, C = c.dim, NH = c.heads, NKV = c.kv_heads, HS = c.head_dim();
  const int s = a.slot(l);  // where this block's intermediates live
  const int KV = c.kv_dim(), F = c.ffn_dim;
  const Device d = a.device;
  const float theta = float(c.rope_theta);
  const auto w = [&](LayerParam i) { return p[i].data<T>(); };
  const auto dw = [&](LayerParam i) { return g[i].data<T>(); };
  // dresidual is the gradient of both residual-add inputs; the RMSNorm backwards add the branches into it.
  T* dresidual = a.dresidual.data<T>();
  T* dln = a.dln.data<T>();

  // MLP branch. The ops accumulate into activation gradients too, so each scratch is zeroed first.
  a.dswiglu.zero_();
  matmul_backward(d, a.dswiglu.data<T>(), dw(kDown), dresidual, slice<T>(a.swiglu, s), w(kDown), N, F, C);
  a.dgate.zero_();
  a.dup.zero_();
  ops::swiglu_backward(d, a.dgate.data<T>(), a.dup.data<T>(), a.dswiglu.data<T>(), slice<T>(a.gate, s),
                       slice<T>(a.up, s), size_t(N) * F);
  a.dln.zero_();
  matmul_backward(d, dln, dw(kGate), a.dgate.data<T>(), slice<T>(a.ln2, s), w(kGate), N, C, F);
  matmul_backward(d, dln, dw(kUp), a.dup.data<T>(), slice<T>(a.ln2, s), w(kUp), N, C, F);
  ops::rmsnorm_backward(d, dresidual, dw(kMlpNorm), dln, slice<T>(a.residual2, s), w(kMlpNorm),
                        slice<Stat>(a.ln2_rstd, s), N, C);
  // Attention branch.
  a.datty.zero_();
  matmul_backward(d, a.datty.data<T>(), dw(kO), dresidual, slice<T>(a.atty, s), w(kO), N, C, C);
  a.dqkv.zero_();
  ops::attention_backward(d, a.dqkv.data<T>(), a.datty.data<T>(), slice<T>(a.qkv, s), slice<T>(a.att, s), B, Tn,
                          C, NH);
  a.dq.zero_();
  a.dk.zero_();
  a.dv.zero_();
  ops::gqa_pack_backward(d, a.dq.data<T>(), a.dk.data<T>(), a.dv.data<T>(), a.dqkv.data<T>(), B, Tn, NH, NKV, HS);
  ops::rope_backward(d, a.dq.data<T>(), B, Tn, NH, HS, theta);
  ops::rope_backward(d, a.dk.data<T>(), B, Tn, NKV, HS, theta);
  a.dln.zero_();
  const T* ln1 = slice<T>(a.ln1, s);
  matmul_backward(d, dln, dw(kQ), a.dq.data<T>(), ln1, w(kQ), N, C, C);
  matmul_backward(d, dln, dw(kK), a.dk.data<T>(), ln1, w(kK), N, C, KV);
  matmul_backward(d, dln, dw(kV), a.dv.data<T>(), ln1, w(kV), N, C, KV);
  ops::rmsnorm_backward(d, dresidual, dw(kAttnNorm), dln, layer_input<T>(a, l), w(kAttnNorm),
                        slice<Stat>(a.ln1_rstd, s), N, C);
}

template <class T>
void Layers<T>::final_norm_forward(const UnitTensors& p) const {
  ops::rmsnorm_forward(a.device, a.lnf.data<T>(), a.lnf_rstd.data<Stat>(), layer_input<T>(a, c.layers),
                       p[kFinalNorm].data<T>(), a.B * a.T, c.dim, kRmsNormEps);
}

template <class T>
void Layers<T>::final_norm_backward(const UnitTensors& p, const UnitTensors& g) const {
  a.dresidual.zero_();
  ops::rmsnorm_backward(a.device, a.dresidual.data<T>(), g[kFinalNorm].data<T>(), a.dln.data<T>(),
                        layer_input<T>(a, c.layers), p[kFinalNorm].data<T>(), a.lnf_rstd.data<Stat>(), a.B * a.T,
                        c.dim);
}

template struct Layers<float>;
template struct Layers<double>;
template struct Layers<bf16>;

}  // namespace zshard::llama
