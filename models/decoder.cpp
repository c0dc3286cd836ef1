#include "models/decoder.h"

namespace zshard {

void DecoderBuffers::visit_stream(int B, int T, int64_t C, int64_t L, DType dtype, const BufferVisitor& f) {
  f(inputs, {B, T}, DType::i32);
  f(targets, {B, T}, DType::i32);
  for (Tensor* t : {&encoded, &lnf, &dresidual, &dln}) f(*t, {B, T, C}, dtype);
  f(residual3, {L, B, T, C}, dtype);
  f(losses, {B, T}, dtype);
}

void DecoderBuffers::visit_attention(int B, int T, int64_t C, int64_t NH, int64_t S, DType dtype,
                                     const BufferVisitor& f) {
  f(ln1, {S, B, T, C}, dtype);
  f(qkv, {S, B, T, 3 * C}, dtype);
  f(att, {S, B, NH, T, T}, dtype);
  for (Tensor* t : {&atty, &residual2, &ln2}) f(*t, {S, B, T, C}, dtype);
}

bool uses_fused_epilogues(FusedEpilogues mode, Device device, DType dtype) {
  if (mode != FusedEpilogues::automatic) return mode == FusedEpilogues::on;
  // Where fused and separate give the same bits. On cuda the fused kernels wait for a GPU to have run their
  // checks (scripts/gpu-acceptance.sh); the cpu's bf16, cuda's reference, rounds as cuda's default path does.
  return device == Device::cpu && dtype != DType::bf16;
}

}  // namespace zshard
