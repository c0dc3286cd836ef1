// The language-model head the hand-written models share: logits = x @ W^T for an output matrix W of
// (V, C) (GPT-2's tied wte, Llama's lm_head or tied embedding), the token losses, and the backward; and,
// for a head tied to the embedding, when its weight gradient is added (the protocol around it is in
// models/decoder.h).
#pragma once

#include <zshard/model.h>
#include <zshard/tensor.h>

#include "models/model_support.h"

namespace zshard {

// Row stride of the logits: the vocabulary rounded up to a multiple of 64, so that every row starts
// 128-byte aligned and cuBLAS can use its aligned tensor-core kernels for the head's GEMMs (GPT-2's
// 50257 is odd). The padding columns are never read.
inline int logits_row_stride(int vocab) { return (vocab + 63) / 64 * 64; }

struct LmHead {
  Device device;
  int N, C, V;  // rows (B*T), channels, vocabulary

  // logits (N, logits_row_stride(V)) = x @ W^T and the token losses; returns their sum, or adds it to
  // `loss_sum` when given (ParamContext::loss_sum) and returns 0. With `backward` the logits are replaced
  // by dlogits = dloss * (softmax - onehot).
  template <class T>
  double forward(T* logits, T* losses, const T* x, const T* W, const int32_t* targets, bool backward,
                 float dloss, double* loss_sum) const;
  // dx = dlogits @ W (set).
  template <class T>
  void input_grad(T* dx, const T* dlogits, const T* W) const;
  // dW += dlogits^T @ x. Reads only dlogits and x, so a tied head can add it later than input_grad, for
  // as long as both are kept (it may be left to the embedding's backward: HeadGradient).
  template <class T>
  void weight_grad(T* dW, const T* dlogits, const T* x) const;
};

// The head's steps over a model's activations `a`, whose fields GPT-2's and Llama's name alike: lnf (the
// head's input), dln (its input gradient), logits, losses and targets.
template <class T, class Acts>
struct HeadSteps {
  Acts& a;
  int dim, vocab;

  LmHead head() const { return {a.device, a.B * a.T, dim, vocab}; }
  // logits = lnf @ W^T and the token losses, their sum as LmHead::forward gives it. With `backward`, the
  // logits are replaced by dlogits = dloss * (softmax - onehot).
  double forward(const Tensor& W, bool backward, float dloss, double* loss_sum) const {
    return head().forward(a.logits.template data<T>(), a.losses.template data<T>(), a.lnf.template data<T>(),
                          W.data<T>(), a.targets.template data<int32_t>(), backward, dloss, loss_sum);
  }
  // a.dln = dlogits @ W (set).
  void input_grad(const Tensor& W) const {
    head().input_grad(a.dln.template data<T>(), a.logits.template data<T>(), W.data<T>());
  }
  // dW += dlogits^T @ lnf: right after input_grad, or, tied and deferred, at the embedding's backward
  // (nothing writes the dlogits or lnf in between). Nothing for a frozen W (its gradient undefined).
  void weight_grad(const Tensor& dW) const {
    if (dW.defined()) head().weight_grad(dW.data<T>(), a.logits.template data<T>(), a.lnf.template data<T>());
  }
};

// When a head tied to the embedding (unit 0) adds its weight gradient dW = dlogits^T x to unit 0's
// gradients. Immediate: at the head's backward, so that gradient is open through every block's backward,
// a full V x C buffer under sharded gradients. Deferred: at the embedding's backward, just before its own
// addition (the same order, the same bits), keeping the dlogits (tokens x V) until then instead; what
// that adds to the activations is at most the block scratch, which no longer shares the logits' bytes
// (LogitsRegion). by_tokens, the default, defers when a micro-batch has fewer tokens than channels, where
// the dlogits are smaller than the gradient they keep closed (but for the rows' padding): under sharded
// gradients the trade then favours deferring. Where gradients are resident (ddp, zero1) it frees nothing
// and costs that scratch. Tests force either order.
enum class HeadGradient { by_tokens, immediate, deferred };
bool defers_head_gradient(HeadGradient when, int B, int T, int channels);

// The logits and what lives only inside one block's forward or backward (a model's block transients, and
// with recomputation its one slot of intermediates) in one region: the logits are dead while any block
// runs, unless the head's weight gradient is deferred to the embedding's backward, which reads the
// dlogits after every block: then the logits have bytes of their own and the region holds the block's
// buffers only.
struct LogitsRegion {
  Tensor shared;
  Tensor logits;               // (B,T,Vp), rows Vp = logits_row_stride apart; dlogits in the backward
  bool deferred_head = false;  // the dlogits are kept for the embedding's backward

  // For a model's activation list: visits the logits when deferred, then the region, sized for the
  // transients and, unless deferred, the logits.
  void visit_logits_region(int B, int T, int vocab, DType dtype, bool deferred, const BufferList& transients,
                           const BufferVisitor& f);
  // Once the region is allocated: cuts the logits (unless deferred) and the transients from it.
  void cut_logits_region(int B, int T, int vocab, DType dtype, bool deferred, const BufferList& transients);

 private:
  BufferList logits_list(int B, int T, int vocab, DType dtype);
};

}  // namespace zshard
