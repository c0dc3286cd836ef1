// The model API: how a model plugs into the zshard runtime.
//
// A model is an ordered list of units (for GPT-2: embeddings, one per block, the final LayerNorm).
// Each unit declares its parameters; the runtime owns them, flattens each unit into one buffer and
// shards it. The model never knows the strategy: around each unit's computation it
// asks the runtime for the unit's parameters and hands back its gradients:
//
//   forward:   p = ctx.gather(u);  ...compute...;  ctx.release(u);
//   backward:  p = ctx.gather(u);  g = ctx.grads(u);  ...accumulate into g...;  ctx.release(u);
//              ctx.grads_ready(u);   // the last time anything adds into u's gradients this micro-step
//
// A unit may be gathered more than once (GPT-2's head reuses the embedding unit's wte), and its
// gradients may be requested in several places before grads_ready. Every backward makes every unit with
// trainable parameters ready once, one the micro-batch did not use too (its gradients then add nothing):
// the engine refuses a backward that leaves one out, which would not train (LocalParams' events show it).
//
// Activation checkpointing (set_recompute(blocks)) changes what a model keeps between
// forward and backward, never the protocol or the math: each block unit's forward runs again inside
// its backward, between that backward's gather and release, so the losses and gradients are the same
// bits and the collectives the same ones.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <zshard/tensor.h>

namespace zshard {

struct ParamSpec {
  std::string name;   // the name in saved weights (Hugging Face GPT-2 names for GPT-2)
  Shape shape;        // the saved layout
  bool weight_decay = true;  // AdamW decays matrices and embeddings, not biases or LayerNorm gains (torch decays all)
  // Trained by no step: no gradient, master weight or Adam state is kept for it, and its entry in
  // ParamContext::grads() is an undefined Tensor, so that backward skips its weight gradient while
  // still computing the input gradients that flow through it. EngineOptions::freeze freezes more.
  bool frozen = false;
  int64_t numel() const { return shape_numel(shape); }
};

struct UnitSpec {
  std::string name;
  std::vector<ParamSpec> params;
  int64_t numel() const;
};

// Views of one unit's parameters or gradients, in UnitSpec::params order.
using UnitTensors = std::vector<Tensor>;

class ParamContext {
 public:
  virtual ~ParamContext() = default;
  // Full parameters of `unit`, valid until the matching release().
  virtual const UnitTensors& gather(int unit) = 0;
  virtual void release(int unit) = 0;
  // Full-size gradient accumulators of `unit`, valid until grads_ready(). Backward ops add into them. A
  // frozen parameter's entry is an undefined Tensor (the op gets a null pointer and skips that gradient).
  virtual const UnitTensors& grads(int unit) = 0;
  virtual void grads_ready(int unit) = 0;
  // Device and dtype in which the model should compute.
  virtual Device device() const = 0;
  virtual DType compute_dtype() const = 0;
  // A double on device() to which the model may add the sum of its token losses, in stream order, rather
  // than return it: the runtime reads it once per optimizer step, so that the host does not wait for the
  // device between a micro-step's forward and backward. Null (the default): the model returns the sum.
  virtual double* loss_sum() { return nullptr; }
};

// One micro-batch on this rank: B sequences of T tokens, inputs and targets (B*T each, host memory). The
// caller may reuse the memory once forward_backward returns, except page-locked memory (cudaHostAlloc),
// which the device reads from where it is, later: keep that until the step's end.
struct Batch {
  const int32_t* inputs = nullptr;
  const int32_t* targets = nullptr;
  int B = 0;
  int T = 0;
};

// What forward_backward keeps for the backward (--activation-checkpointing).
enum class Recompute {
  none,    // every block's intermediates, from its forward to its backward
  blocks,  // each block's input only; the block's forward is recomputed right before its backward
};

// How a model computes causal attention (--attention). A model keeps for the backward either the softmax
// probabilities, (B, heads, T, T) a block (blocks), or only each query row's log-sum-exp, (B, heads, T)
// a block, recomputing the probabilities inside the backward (fused). automatic picks fused where it runs
// (choose_attention). The results differ by rounding only.
enum class AttentionKernel { automatic, fused, blocks };
// Whether a model computes through the fused forms of its ops where it has them (--fused-epilogues,
// <zshard/ops.h>): the linear layers' bias, GELU and bias gradient inside their GEMMs (cuBLASLt's
// epilogues on cuda), a residual add inside the norm that follows it, and activation gradients set by
// their first contribution rather than zeroed and then accumulated. Fewer kernels and bytes, the same
// results on the cpu in f32 and f64 (the same operations in the same order); in bf16 a fused linear layer
// rounds once where the separate ops round after the GEMM, the bias and the GELU. automatic: fused on cuda
// and on the cpu in f32 and f64; separate in bf16 on the cpu, which keeps the separate ops' rounding as the
// reference the cuda kernels are checked against.
enum class FusedEpilogues { automatic, on, off };

// What one op of a step holds at once, by when it runs: before the step's first grads_ready (the forward,
// a head's backward), when no gradient is being reduced; after it, beside the reductions in flight; and in
// the backward of unit 0, made ready last (an embedding's), beside every other unit's reduction but not its
// own, which follows.
struct WorkspaceBytes {
  int64_t before_reductions = 0;
  int64_t during_reductions = 0;
  int64_t last_unit = 0;
  int64_t most() const {
    const int64_t a = before_reductions > during_reductions ? before_reductions : during_reductions;
    return a > last_unit ? a : last_unit;
  }
};

class Model {
 public:
  virtual ~Model() = default;
  virtual std::vector<UnitSpec> units() const = 0;
  // Fills one unit's parameters with their initial values; the same seed gives the same values whatever
  // the world size or strategy.
  virtual void init_unit(int unit, const UnitTensors& params, uint64_t seed) const = 0;
  // Forward and backward over one micro-batch. Adds loss_scale * d(sum of token losses)/d(param) into
  // ctx.grads and returns the sum of the B*T token losses, or adds it to ctx.loss_sum() and returns 0.
  virtual double forward_backward(ParamContext& ctx, const Batch& batch, float loss_scale) = 0;
  // Forward only; the sum of the token losses as forward_backward gives it.
  virtual double forward(ParamContext& ctx, const Batch& batch) = 0;
  // Bytes this model will allocate for activations at batch (B, T) in the recompute mode set: what
  // the memory estimator uses.
  virtual int64_t activation_bytes(int B, int T, DType dtype) const = 0;
  // The most short-lived scratch (the memory report's `workspace`) one op of a forward_backward at batch
  // (B, T) holds at once on `device` in `dtype`, in the modes set (WorkspaceBytes): what the memory
  // estimator adds to the activations. On the cpu in bf16 each op computes on fp32 copies of its arrays, a
  // block at a time (at most 64 MiB). The default counts the cross-entropy's copies there, before and during
  // reductions, and nothing elsewhere: a model whose ops copy wider arrays (a wide MLP's) says so.
  virtual WorkspaceBytes workspace_bytes(int B, int T, DType dtype, Device device) const;
  // Whether backward at batch (B, T) keeps a unit's gradients open while other units' backward runs:
  // its grads() before theirs and its grads_ready() after, as a tied head that adds its weight's gradient
  // at the start of backward does, the embedding adding the rest at the end. The memory estimator then
  // counts that unit's full gradient (the largest unit's, on the safe side) beside the ones in flight
  // under sharded gradients. The default says yes, the safe side for a model that does not tell.
  virtual bool keeps_gradients_open(int B, int T) const;
  // Applies to every later forward_backward and activation_bytes. The default accepts none only: a model
  // that recomputes nothing throws UsageError for blocks.
  virtual void set_recompute(Recompute mode);
  // Applies to every later forward_backward and activation_bytes: fused or blocks (automatic is resolved by
  // choose_attention, for a device and dtype, before it gets here). The default accepts blocks only, what
  // a model of one's own computes (its attention, if any, its own way): fused throws UsageError.
  virtual void set_attention(AttentionKernel kernel);
  // Applies to every later forward_backward and forward. The default ignores it: a model without fused
  // forms computes as it always has.
  virtual void set_fused_epilogues(FusedEpilogues mode);
  // Token ids run from 0 to vocab_size() - 1; sequences are at most context_length() tokens.
  virtual int vocab_size() const = 0;
  virtual int context_length() const = 0;
  // Model FLOPs per token of a sequence of T tokens, forward and backward, for MFU. The default counts
  // the matmuls only: 6 per parameter. Models with attention add its T-dependent part.
  virtual double flops_per_token(int T) const;
};

// Parameter elements of all units.
int64_t num_params(const Model& model);

// Refuses a batch with B or T not positive, T beyond the context `ctx`, a null pointer or a token outside
// [0, vocab): what a model checks before it reads one. Throws UsageError, its message beginning with `model`.
void check_batch(std::string_view model, const Batch& batch, int vocab, int ctx);

// Sets the attention `model` computes in `dtype` on `device` and returns it. fused is refused where it
// cannot run there (UsageError naming why: ops::fused_attention_unavailable); automatic takes fused where
// it runs and the model has it, else blocks, and writes to `fallback` (when given) why a bf16 run on a
// device kept blocks (no cuDNN at run time), "" otherwise.
AttentionKernel choose_attention(Model& model, AttentionKernel requested, Device device, DType dtype,
                                 std::string* fallback = nullptr);

}  // namespace zshard
