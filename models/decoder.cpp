#include "models/decoder.h"

#include <algorithm>
#include <limits>

#include <zshard/ops.h>

#include "kernels/causal_blocks.h"
#include "kernels/cpu/ops.h"

namespace zshard {

void DecoderBuffers::visit_stream(int B, int T, int64_t C, int64_t L, DType dtype, const BufferVisitor& f) {
  f(inputs, {B, T}, DType::i32);
  f(targets, {B, T}, DType::i32);
  for (Tensor* t : {&encoded, &lnf, &dresidual, &dln}) f(*t, {B, T, C}, dtype);
  f(residual3, {L, B, T, C}, dtype);
  f(losses, {B, T}, dtype);
}

void DecoderBuffers::visit_attention(int B, int T, int64_t C, int64_t NH, int64_t S, DType dtype,
                                     AttentionKernel kernel, const BufferVisitor& f) {
  f(ln1, {S, B, T, C}, dtype);
  f(qkv, {S, B, T, 3 * C}, dtype);
  if (kernel == AttentionKernel::blocks) f(att, {S, B, NH, T, T}, dtype);
  for (Tensor* t : {&atty, &residual2, &ln2}) f(*t, {S, B, T, C}, dtype);
}

void DecoderBuffers::visit_attention_stats(int B, int T, int64_t NH, int64_t S, DType dtype, AttentionKernel kernel,
                                           const BufferVisitor& f) {
  if (kernel == AttentionKernel::fused) f(att_lse, {S, B, NH, T}, ops::attention_stat_dtype(dtype));
}

template <class E>
void DecoderBuffers::attention_forward(int s, int C, int NH) const {
  E* out = slice<E>(atty, s);
  const E* in = slice<E>(qkv, s);
  if (attention == AttentionKernel::fused)
    ops::fused_attention_forward(device, out, slice<ops::AttentionStat<E>>(att_lse, s), in, B, T, C, NH);
  else
    ops::attention_forward(device, out, slice<E>(att, s), in, B, T, C, NH);
}

template <class E>
void DecoderBuffers::attention_backward(int s, Tensor& dqkv, const E* datty, int C, int NH) const {
  const E* in = slice<E>(qkv, s);
  if (attention == AttentionKernel::fused) {
    // Writes dqkv whole: no zeroing first.
    ops::fused_attention_backward(device, dqkv.data<E>(), datty, in, slice<E>(atty, s),
                                  slice<ops::AttentionStat<E>>(att_lse, s), B, T, C, NH);
    return;
  }
  dqkv.zero_();  // the blocks backward accumulates
  ops::attention_backward(device, dqkv.data<E>(), datty, in, slice<E>(att, s), B, T, C, NH);
}

namespace {

// On the cpu in bf16: a linear layer's GEMMs (forward, input and weight gradients), or its adapted form's,
// whose input-gradient scratch (N, R) lives through the adapter's GEMMs.
int64_t cpu_bf16_linear_workspace(const LoraPlan& plan, int i, int N, bool fused) {
  const LoraPlan::Layer& layer = plan.layers()[size_t(i)];
  const int C = int(layer.in), OC = int(layer.out), R = plan.rank();
  if (plan.adapter(i) < 0 && fused) return cpu::bf16_linear_epilogue_scratch_bytes(N, C, OC);
  int64_t most = std::max({cpu::bf16_gemm_scratch_bytes(N, OC, C), cpu::bf16_gemm_scratch_bytes(N, C, OC),
                           cpu::bf16_gemm_scratch_bytes(C, OC, N)});
  if (plan.adapter(i) < 0) return most;
  // kernels/lora_linear.h: the forward's inp @ A^T and hidden @ B^T, then the backward's, beside dhidden.
  most = std::max({most, cpu::bf16_gemm_scratch_bytes(N, R, C), cpu::bf16_gemm_scratch_bytes(N, OC, R)});
  const int64_t hidden = int64_t(N) * R * int64_t(sizeof(bf16));
  for (int64_t gemm : {cpu::bf16_gemm_scratch_bytes(N, R, OC), cpu::bf16_gemm_scratch_bytes(N, C, R),
                       cpu::bf16_gemm_scratch_bytes(R, C, N), cpu::bf16_gemm_scratch_bytes(OC, R, N)})
    most = std::max(most, hidden + gemm);
  return most;
}

}  // namespace

WorkspaceBytes decoder_workspace_bytes(const LoraPlan& linears, int B, int T, int C, int NH, int V, DType dtype,
                                       Device device, AttentionKernel kernel, bool fused, bool deferred_head,
                                       int64_t layer_ops) {
  // The ops take an int of tokens; a batch beyond it (the estimator's search may ask) is sized at the most,
  // where every op's copies are at their bound.
  const int N = int(std::min<int64_t>(int64_t(B) * T, std::numeric_limits<int>::max()));
  const int64_t adapter_scratch = linears.enabled() ? int64_t(N) * linears.rank() * dtype_size(dtype) : 0;
  if (device == Device::cuda) {
    if (kernel != AttentionKernel::blocks) return {adapter_scratch, adapter_scratch, 0};
    const int64_t blocks =
        std::max(adapter_scratch, int64_t(causal_blocks::score_gradient_bytes(B, T, NH, dtype_size(dtype))));
    return {blocks, blocks, 0};
  }
  if (dtype != DType::bf16) return {adapter_scratch, adapter_scratch, 0};
  int64_t blocks = std::max(layer_ops, kernel == AttentionKernel::fused
                                           ? cpu::bf16_fused_attention_backward_scratch_bytes(B, T, C)
                                           : cpu::bf16_attention_backward_scratch_bytes(B, T, C, NH));
  for (int i = 0; i < int(linears.layers().size()); ++i)
    blocks = std::max(blocks, cpu_bf16_linear_workspace(linears, i, N, fused));
  const int64_t head = std::max({cpu::bf16_gemm_scratch_bytes(N, V, C), cpu::bf16_gemm_scratch_bytes(N, C, V),
                                 cpu::bf16_cross_entropy_scratch_bytes(N, V)});
  const int64_t weight_grad = linears.enabled() ? 0 : cpu::bf16_gemm_scratch_bytes(V, C, N);
  if (deferred_head) return {std::max(blocks, head), blocks, weight_grad};
  return {std::max({blocks, head, weight_grad}), blocks, 0};
}

AttentionKernel decoder_attention(AttentionKernel kernel) {
  ZS_CHECK(kernel != AttentionKernel::automatic,
           "set_attention takes fused or blocks: choose_attention resolves automatic for a device and dtype");
  return kernel;
}

#define ZS_INSTANTIATE(E)                                                              \
  template void DecoderBuffers::attention_forward<E>(int, int, int) const;            \
  template void DecoderBuffers::attention_backward<E>(int, Tensor&, const E*, int, int) const;
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(double)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

bool uses_fused_epilogues(FusedEpilogues mode, Device device, DType dtype) {
  if (mode != FusedEpilogues::automatic) return mode == FusedEpilogues::on;
  // On cuda the fused kernels matched the cpu on a GPU (CudaFused.*, CudaModel.Fused*) and ran gpt2 4-5%
  // faster. On the cpu they give the same bits in f32/f64; the cpu's bf16, cuda's reference, rounds as
  // the separate kernels do.
  return device == Device::cuda || dtype != DType::bf16;
}

}  // namespace zshard
