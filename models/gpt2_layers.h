// GPT-2 internals shared by gpt2.cpp (units, protocol) and gpt2_layers.cpp (the math): the activation
// buffers and each unit's forward and backward, written out by hand in the style of llm.c.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include <zshard/model.h>
#include <zshard/ops.h>

#include "models/gpt2_config.h"
#include "models/decoder.h"

namespace zshard::gpt2 {

// Indices into a block unit's params and grads, in the order GPT2::units() declares them.
enum BlockParam {
  kLn1Weight, kLn1Bias, kAttnWeight, kAttnBias, kAttnProjWeight, kAttnProjBias,
  kLn2Weight, kLn2Bias, kFcWeight, kFcBias, kFcProjWeight, kFcProjBias, kNumBlockParams
};
// A block's linear layers, in the order GPT2Config::lora_plan lists them, and each one's weight (its bias
// follows it).
enum BlockLinear { kQkv, kAttnOut, kFc, kFcOut };
inline constexpr BlockParam kLinearWeight[] = {kAttnWeight, kAttnProjWeight, kFcWeight, kFcProjWeight};
// Indices into the embedding and final LayerNorm units.
enum EmbedParam { kWte, kWpe };
enum FinalNormParam { kLnfWeight, kLnfBias };

// Everything forward_backward keeps for one (B, T), on the device it computes on: views into the
// activations allocations. Per-block intermediates have a leading dimension S = slots(recompute, L) (L,
// or 1 reused by every block). The logits share their region (LogitsRegion) with the views of block
// scratch below.
struct Activations : DecoderBuffers {
  Tensor ln1_mean, ln1_rstd, ln2_mean, ln2_rstd;  // (S,B,T) in NormStat; ln1, qkv (S,B,T,3C), att and
                                                 // atty (before c_proj) are DecoderBuffers'
  Tensor fch, fch_gelu;                  // (S,B,T,4C)
  Tensor lnf_mean, lnf_rstd;             // (B,T)
  // Cut from the LogitsRegion's shared region, with recomputation beside the one slot of intermediates.
  Tensor proj;                           // (B,T,C) a c_proj output before its residual add (scratch)
  Tensor datty;                          // (B,T,C)
  Tensor dqkv;                           // (B,T,3C)
  Tensor dfch, dfch_gelu;                // (B,T,4C)
  std::vector<Tensor> lora_hidden;       // (S,B,T,R) an adapted layer's inp @ A^T, by BlockLinear (LoraPlan)

  // The model's part of the activation list (models/decoder.h: decoder_buffers): the LayerNorm statistics and,
  // without recomputation, the blocks' intermediates.
  BufferList kept(const GPT2Config& c, int B, int T, DType dtype, Recompute mode, AttentionKernel kernel);
  // What lives only inside one block's forward or backward, cut from the logits' region.
  BufferList transients(const GPT2Config& c, int B, int T, DType dtype, Recompute mode, AttentionKernel kernel);
};

// GPT-2's computation in dtype T (float or bf16, and double on cpu) over one set of
// activations, on a.device. The tokens are a.inputs and a.targets.
template <class T>
struct Layers {
  using Stat = ops::NormStat<T>;  // element type of the LayerNorm means and rstds
  const GPT2Config& c;
  const LoraPlan& lora;
  Activations& a;
  bool fused;  // through the fused ops (uses_fused_epilogues)

  void embedding_forward(const UnitTensors& p) const;
  // Adds the residual-stream gradient into dwte and dwpe; reads no parameters.
  void embedding_backward(const UnitTensors& g) const;
  void block_forward(int layer, const UnitTensors& p) const;
  // On entry a.dresidual holds d(loss)/d(block output); on exit d(loss)/d(block input).
  void block_backward(int layer, const UnitTensors& p, const UnitTensors& g) const;
  void final_norm_forward(const UnitTensors& p) const;
  // From a.dln = d(loss)/d(lnf) to a.dresidual = d(loss)/d(last block output).
  void final_norm_backward(const UnitTensors& p, const UnitTensors& g) const;
  // out = inp @ W + b for layer m of a block's params p, through its LoRA adapter when it has one (its
  // hidden in slot s); with `pre`, pre = inp @ W + b and out = gelu(pre) (the MLP's c_fc). Its backward
  // makes dinp the gradient of the layer's input, set by the fused op or else zeroed and added to, and adds
  // the gradients that g holds (a frozen one's is skipped); with_bias false: the bias gradient was taken
  // already (by the fused backward of the layer after the GELU).
  void linear_forward(BlockLinear m, int s, const UnitTensors& p, T* out, T* pre, const T* inp, int C, int OC) const;
  void linear_backward(BlockLinear m, int s, const UnitTensors& p, const UnitTensors& g, Tensor& dinp, const T* dout,
                       const T* inp, int C, int OC, bool with_bias = true) const;
  // The head, tied to wte.
  HeadSteps<T, Activations> head() const { return {a, c.dim, c.vocab}; }
};

extern template struct Layers<float>;
extern template struct Layers<double>;
extern template struct Layers<bf16>;

}  // namespace zshard::gpt2
