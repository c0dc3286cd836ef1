// Llama internals shared by llama.cpp (units, protocol) and llama_layers.cpp (the math): the activation
// buffers and each unit's forward and backward, written out by hand as GPT-2's are.
#pragma once
#include <vector>

#include <zshard/model.h>
#include <zshard/ops.h>

#include "models/llama_config.h"
#include "models/lm_head.h"
#include "models/model_support.h"

namespace zshard::llama {

// Indices into a layer unit's params and grads, in the order Llama::units() declares them. Matrices have
// Hugging Face's nn.Linear layout (out, in): y = x @ W^T.
enum LayerParam { kAttnNorm, kQ, kK, kV, kO, kMlpNorm, kGate, kUp, kDown, kNumLayerParams };
enum EmbedParam { kEmbed };
enum FinalParam { kFinalNorm, kLmHead };  // kLmHead only with an untied head

// Everything forward_backward keeps for one (B, T). Per-layer buffers have a leading dimension: L for the
// layer outputs (residual3), S = slots(recompute, L) for the intermediates (L, or 1 reused by every layer).
// The logits share their region (LogitsRegion) with the views of layer scratch below.
struct Activations : BatchBuffers, LogitsRegion {
  Tensor encoded;                     // (B,T,C) the token embedding: layer 0's input
  Tensor ln1, ln1_rstd;               // (S,B,T,C), (S,B,T)
  Tensor qkv;                         // (S,B,T,3C) rotated q, and k and v repeated per query head
  Tensor att;                         // (S,B,NH,T,T) softmax probabilities
  Tensor atty;                        // (S,B,T,C) attention output before o_proj
  Tensor residual2;                   // (S,B,T,C) after the attention residual add
  Tensor ln2, ln2_rstd;
  Tensor gate, up, swiglu;            // (S,B,T,F)
  Tensor residual3;                   // (L,B,T,C) layer output
  Tensor lnf, lnf_rstd;               // (B,T,C), (B,T)
  Tensor losses;                      // (B,T)
  Tensor dresidual, dln;              // (B,T,C) backward scratch shared by all layers
  // Scratch shared by all layers, cut from the LogitsRegion's shared region (with recomputation beside the
  // one slot of intermediates): projections before they are packed or added, and the backward's.
  Tensor proj, q, dq, datty;          // (B,T,C)
  Tensor k, v, dk, dv;                // (B,T,KV)
  Tensor dqkv;                        // (B,T,3C)
  Tensor dswiglu, dgate, dup;         // (B,T,F)

  // Bytes of the allocations for (B, T), `mode` and `deferred_head`, tokens included: activation_bytes.
  static int64_t bytes(const LlamaConfig& c, int B, int T, DType dtype, Recompute mode,
                       bool deferred_head);
  void allocate(const LlamaConfig& c, int b, int t, DType type, Device dev, Recompute mode,
                bool deferred_head);
};

template <class T>
struct Layers {
  using Stat = ops::NormStat<T>;
  const LlamaConfig& c;
  Activations& a;

  void embedding_forward(const UnitTensors& p) const;
  void embedding_backward(const UnitTensors& g) const;  // reads no parameters
  void layer_forward(int layer, const UnitTensors& p) const;
  // On entry a.dresidual holds d(loss)/d(layer output); on exit d(loss)/d(layer input).
  void layer_backward(int layer, const UnitTensors& p, const UnitTensors& g) const;
  void final_norm_forward(const UnitTensors& p) const;
  // From a.dln = d(loss)/d(lnf) to a.dresidual = d(loss)/d(last layer output).
  void final_norm_backward(const UnitTensors& p, const UnitTensors& g) const;
  // The head: the final unit's lm_head, or tied, the embedding.
  HeadSteps<T, Activations> head() const { return {a, c.dim, c.vocab}; }
};

extern template struct Layers<float>;
extern template struct Layers<double>;
extern template struct Layers<bf16>;

}  // namespace zshard::llama
