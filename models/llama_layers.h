// Llama internals shared by llama.cpp (units, protocol) and llama_layers.cpp (the math): the activation
// buffers and each unit's forward and backward, written out by hand as GPT-2's are.
#pragma once
#include <vector>

#include <zshard/model.h>
#include <zshard/ops.h>

#include "models/llama_config.h"
#include "models/decoder.h"

namespace zshard::llama {

// Indices into a layer unit's params and grads, in the order Llama::units() declares them. Matrices have
// Hugging Face's nn.Linear layout (out, in): y = x @ W^T.
enum LayerParam { kAttnNorm, kQ, kK, kV, kO, kMlpNorm, kGate, kUp, kDown, kNumLayerParams };
// A layer's projections, in the order LlamaConfig::lora_plan lists them, and each one's weight.
enum LayerLinear { kQProj, kKProj, kVProj, kOProj, kGateProj, kUpProj, kDownProj };
inline constexpr LayerParam kLinearWeight[] = {kQ, kK, kV, kO, kGate, kUp, kDown};
enum EmbedParam { kEmbed };
enum FinalParam { kFinalNorm, kLmHead };  // kLmHead only with an untied head

// Everything forward_backward keeps for one (B, T). Per-layer intermediates have a leading dimension
// S = slots(recompute, L) (L, or 1 reused by every layer). The logits share their region (LogitsRegion)
// with the views of layer scratch below.
struct Activations : DecoderBuffers {
  Tensor ln1_rstd, ln2_rstd;          // (S,B,T) in NormStat; ln1, qkv (rotated q, and k and v repeated per
                                      // query head), att and atty (before o_proj) are DecoderBuffers'
  Tensor gate, up, swiglu;            // (S,B,T,F)
  Tensor lnf_rstd;                    // (B,T)
  // Scratch shared by all layers, cut from the LogitsRegion's shared region (with recomputation beside the
  // one slot of intermediates): projections before they are packed or added, and the backward's.
  Tensor proj, q, dq, datty;          // (B,T,C)
  Tensor k, v, dk, dv;                // (B,T,KV)
  Tensor dqkv;                        // (B,T,3C)
  Tensor dswiglu, dgate, dup;         // (B,T,F)
  std::vector<Tensor> lora_hidden;    // (S,B,T,R) an adapted projection's inp @ A^T, by LayerLinear (LoraPlan)

  // The model's part of the activation list (models/decoder.h: decoder_buffers): the RMSNorm statistics and,
  // without recomputation, the layers' intermediates.
  BufferList kept(const LlamaConfig& c, int B, int T, DType dtype, Recompute mode, AttentionKernel kernel);
  // What lives only inside one layer's forward or backward, cut from the logits' region.
  BufferList transients(const LlamaConfig& c, int B, int T, DType dtype, Recompute mode, AttentionKernel kernel);
};

template <class T>
struct Layers {
  using Stat = ops::NormStat<T>;
  const LlamaConfig& c;
  const LoraPlan& lora;
  Activations& a;
  bool fused;  // through the fused ops (uses_fused_epilogues)

  void embedding_forward(const UnitTensors& p) const;
  void embedding_backward(const UnitTensors& g) const;  // reads no parameters
  // A decoder layer, a block as models/decoder.h names them.
  void block_forward(int layer, const UnitTensors& p) const;
  // On entry a.dresidual holds d(loss)/d(layer output); on exit d(loss)/d(layer input).
  void block_backward(int layer, const UnitTensors& p, const UnitTensors& g) const;
  void final_norm_forward(const UnitTensors& p) const;
  // From a.dln = d(loss)/d(lnf) to a.dresidual = d(loss)/d(last layer output).
  void final_norm_backward(const UnitTensors& p, const UnitTensors& g) const;
  // y (N, OC) = x (N, C) @ W^T for projection m of a layer's params p (nn.Linear's (out, in) W), through its
  // LoRA adapter when it has one (its hidden in slot s); the backward adds dx and the gradients g holds (a
  // frozen one's is skipped). The `first` projection into dx starts it: sets it with the fused ops (but
  // through an adapter, which adds), else zeroes it and adds.
  void linear_forward(LayerLinear m, int s, const UnitTensors& p, T* y, const T* x, int C, int OC) const;
  void linear_backward(LayerLinear m, int s, const UnitTensors& p, const UnitTensors& g, Tensor& dx, const T* dy,
                       const T* x, int C, int OC, bool first) const;
  // The head: the final unit's lm_head, or tied, the embedding.
  HeadSteps<T, Activations> head() const { return {a, c.dim, c.vocab}; }
};

extern template struct Layers<float>;
extern template struct Layers<double>;
extern template struct Layers<bf16>;

}  // namespace zshard::llama
