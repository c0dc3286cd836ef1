// What the hand-written decoder-only transformers (GPT-2, Llama) share above their math: the buffers of
// the residual stream, and the order in which a forward_backward gathers, releases and readies its units
// (unit 0 the embedding, units 1..L the blocks, unit L+1 the final norm; a tied head under unit 0).
#pragma once
#include <memory>

#include <zshard/model.h>
#include <zshard/tensor.h>

#include "models/lm_head.h"
#include "models/lora.h"
#include "models/model_support.h"

namespace zshard {

// The buffers a decoder keeps beside its blocks' own intermediates. Models derive their Activations from
// it, so that the protocol below and the head (HeadSteps) find these under the same names.
struct DecoderBuffers : BatchBuffers, LogitsRegion {
  Tensor encoded;         // (B,T,C) the embedding's output: block 0's input
  Tensor residual3;       // (L,B,T,C) block outputs
  Tensor lnf;             // (B,T,C) the final norm's output, the head's input
  Tensor losses;          // (B,T)
  Tensor dresidual, dln;  // (B,T,C) backward scratch shared by all blocks: d(loss)/d(residual stream), and
                          // a norm's output gradient
  // The attention half of a pre-norm block, as every block keeps it: S slots (slots(recompute, L)) each.
  Tensor ln1;        // (S,B,T,C) the first norm's output
  Tensor qkv;        // (S,B,T,3C) q, k and v as attention reads them
  Tensor att;        // (S,B,NH,T,T) softmax probabilities (blocks)
  Tensor att_lse;    // (S,B,NH,T) in AttentionStat: each query row's log-sum-exp (fused), in att's place
  Tensor atty;       // (S,B,T,C) attention output before its projection
  Tensor residual2;  // (S,B,T,C) after the attention residual add
  Tensor ln2;        // (S,B,T,C) the second norm's output, the MLP's input

  // Visits the tokens (i32) and the stream's buffers, encoded to dln (in `dtype`), for C channels and L
  // blocks: the start of a decoder's activation list.
  void visit_stream(int B, int T, int64_t C, int64_t L, DType dtype, const BufferVisitor& f);
  // Visits the attention half's intermediates in `dtype`, S slots, NH heads, for attention computed by
  // `kernel`. Fused attention's statistics, in a dtype of their own, are listed with what is kept, as the
  // norms' statistics are, even with recomputation (a shared region holds one dtype): visit_attention_stats.
  void visit_attention(int B, int T, int64_t C, int64_t NH, int64_t S, DType dtype, AttentionKernel kernel,
                       const BufferVisitor& f);
  void visit_attention_stats(int B, int T, int64_t NH, int64_t S, DType dtype, AttentionKernel kernel,
                             const BufferVisitor& f);
  // Attention of slot s's qkv into its atty, by the kernel these buffers were made for, and its backward
  // from datty into dqkv (a (B,T,3C) scratch of the model's, whose old contents do not matter).
  template <class E>
  void attention_forward(int s, int C, int NH) const;
  template <class E>
  void attention_backward(int s, Tensor& dqkv, const E* datty, int C, int NH) const;
  // The residual stream entering block l (l == L: leaving the last block).
  template <class T>
  T* block_input(int l) const {
    return l == 0 ? encoded.data<T>() : slice<T>(residual3, l - 1);
  }
};

// Every buffer of a decoder's activations `a`, in order: the stream (visit_stream), the model's kept
// buffers (a.kept: its norm statistics and, without recomputation, its blocks' intermediates), then the
// region the logits share with the model's block transients (a.transients): the logits live from the
// head's forward to its backward, while no block runs; deferred, the dlogits live on to the embedding's
// backward and get bytes of their own.
template <class Activations, class Config>
BufferList decoder_buffers(Activations& a, const Config& c, int B, int T, DType dtype, Recompute mode,
                           AttentionKernel kernel, bool deferred_head) {
  return [&a, &c, B, T, dtype, mode, kernel, deferred_head](const BufferVisitor& f) {
    a.visit_stream(B, T, c.dim, c.layers, dtype, f);
    a.kept(c, B, T, dtype, mode, kernel)(f);
    a.visit_logits_region(B, T, c.vocab, dtype, deferred_head, a.transients(c, B, T, dtype, mode, kernel), f);
  };
}

// Bytes of the activations' allocations for (B, T), `mode`, `kernel` and `deferred_head`, tokens included:
// what a model's activation_bytes reports, and what activations_for allocates.
template <class Activations, class Config>
int64_t decoder_activation_bytes(const Config& c, int B, int T, DType dtype, Recompute mode, AttentionKernel kernel,
                                 bool deferred_head) {
  Activations unused;
  return buffer_bytes(decoder_buffers(unused, c, B, T, dtype, mode, kernel, deferred_head));
}

// A decoder's workspace (Model::workspace_bytes), the most one op holds at once at batch (B, T): on the
// cpu in bf16 the fp32 copies of its blocks' linear layers (`linears`, each a GEMM, or with `fused`
// epilogues the fused op where no adapter is on it) and their adapters, of its attention by `kernel`, of
// the model's other block ops (`layer_ops`, its MLP's activation: their cpu bf16 copies, counted on the
// cpu in bf16 alone), and of its head and cross-entropy over
// V tokens; on any device an adapter's input-gradient scratch, and blocks attention's score gradients on
// cuda. The blocks run beside reductions, the head before any but for a `deferred_head`'s weight gradient,
// at the embedding's backward (none where LoRA freezes the head): WorkspaceBytes' three phases.
WorkspaceBytes decoder_workspace_bytes(const LoraPlan& linears, int B, int T, int C, int NH, int V, DType dtype,
                                       Device device, AttentionKernel kernel, bool fused, bool deferred_head,
                                       int64_t layer_ops);

// What a decoder's set_attention stores: fused or blocks, never automatic, which only choose_attention
// can resolve (it needs a device and a dtype).
AttentionKernel decoder_attention(AttentionKernel kernel);

// The model's activations for `batch` in `dtype` on `device`: `acts` as they are when they fit, else made
// anew; the batch's tokens loaded either way.
template <class Activations, class Config>
Activations& activations_for(std::unique_ptr<Activations>& acts, const Config& c, const Batch& batch,
                             DType dtype, Device device, Recompute mode, AttentionKernel kernel, bool deferred_head) {
  const int B = batch.B, T = batch.T;
  if (!acts || !acts->fits(batch, dtype, device, mode, kernel) || acts->deferred_head != deferred_head) {
    acts.reset();  // free the old buffers (views included) before allocating the new ones
    acts = std::make_unique<Activations>();
    acts->allocate(B, T, dtype, device, mode, kernel,
                   decoder_buffers(*acts, c, B, T, dtype, mode, kernel, deferred_head));
    acts->cut_logits_region(B, T, c.vocab, dtype, deferred_head, acts->transients(c, B, T, dtype, mode, kernel));
  }
  acts->load_tokens(batch);
  return *acts;
}

// Whether a model set to `mode` runs the fused ops on `device` in `dtype` (FusedEpilogues, <zshard/model.h>).
bool uses_fused_epilogues(FusedEpilogues mode, Device device, DType dtype);

// The forward up to the final norm: the embedding, then every block, each unit released after its use.
template <class Layers>
void run_blocks_forward(ParamContext& ctx, const Layers& layers, int num_blocks) {
  layers.embedding_forward(ctx.gather(0));
  ctx.release(0);
  for (int l = 0; l < num_blocks; ++l) {
    layers.block_forward(l, ctx.gather(1 + l));
    ctx.release(1 + l);
  }
}

// The blocks' backward, the last first, each under its second gather and followed by grads_ready. With
// `recompute` (Recompute::blocks) a block's intermediates are first rebuilt from its kept input under the
// same gather, as FSDP runs a checkpointed forward inside the unit's backward, so no collective is added.
// That forward reads only the block input and the parameters, which backward never writes; it also
// rewrites the block output with the same bits, which nothing reads any more. The block's gradients are
// opened after it: grads() may wait for an earlier unit's reduction, which the recompute overlaps.
template <class Layers>
void run_blocks_backward(ParamContext& ctx, const Layers& layers, int num_blocks, bool recompute) {
  for (int l = num_blocks - 1; l >= 0; --l) {
    const UnitTensors& p = ctx.gather(1 + l);
    if (recompute) layers.block_forward(l, p);
    layers.block_backward(l, p, ctx.grads(1 + l));
    ctx.release(1 + l);
    ctx.grads_ready(1 + l);
  }
}

// The final norm (unit `final_unit`) and a head tied to parameter `param` of unit 0; returns the loss sum
// (or adds it to ctx.loss_sum() and returns 0). The norm's unit is released before the head gathers unit 0
// a second time (the largest unit: gathered twice per step, not three times), and gathered again for its
// backward, small and prefetched under the head. Under unit 0's gather run the logits, the losses and,
// with `backward`, the head's input gradient and, unless `deferred`, its weight gradient, which opens unit
// 0's grads until the embedding's backward. `layers` is GPT-2's or Llama's, with head() (HeadSteps).
template <class Layers>
double run_final_norm_and_tied_head(ParamContext& ctx, const Layers& layers, int final_unit, int param,
                                    bool backward, bool deferred, float dloss) {
  layers.final_norm_forward(ctx.gather(final_unit));
  ctx.release(final_unit);
  const Tensor& W = ctx.gather(0)[param];
  const auto head = layers.head();
  const double loss = head.forward(W, backward, dloss, ctx.loss_sum());
  if (backward) head.input_grad(W);
  if (backward && !deferred) head.weight_grad(ctx.grads(0)[param]);
  ctx.release(0);
  if (!backward) return loss;
  const UnitTensors& p = ctx.gather(final_unit);
  layers.final_norm_backward(p, ctx.grads(final_unit));
  ctx.release(final_unit);
  ctx.grads_ready(final_unit);
  return loss;
}

// The embedding's backward, which reads only the tokens (unit 0 is not gathered): a deferred head's weight
// gradient first, as it would have come at the head, then the embedding's own addition, the last into
// unit 0's grads, so grads_ready(0) follows.
template <class Layers>
void run_embedding_backward(ParamContext& ctx, const Layers& layers, int param, bool deferred_head) {
  const UnitTensors& g = ctx.grads(0);
  if (deferred_head) layers.head().weight_grad(g[param]);
  layers.embedding_backward(g);
  ctx.grads_ready(0);
}

}  // namespace zshard
