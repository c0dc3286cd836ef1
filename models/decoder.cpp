#include "models/decoder.h"

#include <zshard/ops.h>

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
