// The engine: a model sharded across the world's ranks by a plan, driven by a training loop of zshard's
// (train_main, zshard-train) or of your own, as FSDP2's fully_shard and DeepSpeed's engine are:
//
//   zshard::World world(&argc, &argv);                       // mpirun/srun ranks, or one process
//   const zshard::ShardPlan plan = zshard::resolve_plan({.strategy = {zshard::StrategyKind::zero3}}, world.comm());
//   zshard::Engine engine(model, world.comm(), plan, {.grad_accum = 1, .tokens_per_step = B * T});
//   engine.import_weights("gpt2.safetensors");                     // optional: Hugging Face weights
//   for (...) {
//     engine.forward_backward(my_batch);                           // this rank's share of the step's batch
//     const zshard::StepStats s = engine.step({.lr = my_schedule(step)});  // clip, AdamW on what it owns
//     // s.loss, s.grad_norm: the whole batch's, the same on every rank
//   }
//   zshard::AsyncSave saving = engine.save_async("ck/step-100");   // written while training goes on
//   saving.wait();                                                 // committed: load() on any world size
//
// The model never knows the strategy: the engine owns every unit's parameters, gradients and AdamW state
// as the plan prescribes and implements the model API's gather/release/grads/grads_ready (model.h).
// Every call that says "collective" must be made by every rank of the world, in the same order.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <zshard/communicator.h>
#include <zshard/memory_report.h>
#include <zshard/model.h>
#include <zshard/plan.h>
#include <zshard/tensor.h>

namespace zshard {

class AsyncCheckpoint;
struct EngineInternals;

struct EngineOptions {
  uint64_t seed = 1337;  // initial parameters: the model's init_unit(u, ..., seed), the same on any world
  // Micro-steps per optimizer step: forward_backward calls before each step(). ddp and zero1 reduce
  // gradients on the last one only (no_sync); the sharded strategies reduce every micro-step.
  int grad_accum = 1;
  // Tokens of all ranks' micro-batches of one step together: the gradient is the mean over them, exactly,
  // whatever the split of the batch among the ranks.
  int64_t tokens_per_step = 0;
  // Names of parameters to freeze besides those ParamSpec::frozen marks, `*` matching any characters:
  // {"wte.weight", "h.*.ln_*"}. A frozen parameter is sharded and gathered in the compute dtype and has no
  // gradient, master weight or Adam state. A pattern that matches nothing, or that leaves nothing to
  // train, is refused.
  std::vector<std::string> freeze;
  // Replays each step as one CUDA graph once a plain step has run: cuda, one rank and
  // no offloaded optimizer only, the engine called from the thread that made it. The host then reads a
  // micro-step's loss and the norm after step() only, and evaluates between steps; a model setting changed
  // between steps (set_attention, ...) needs an evaluation or a load first, which record the step anew.
  bool cuda_graphs = false;
};

// AdamW's hyper-parameters for one step (PyTorch's AdamW, with torch.nn.utils.clip_grad_norm_ before it).
// The defaults are nanoGPT's rather than torch's (beta2 0.999, weight decay 0.01, no clipping).
struct AdamW {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // decoupled; matrices and embeddings only (ParamSpec::weight_decay)
  float grad_clip = 1.0f;     // the global gradient norm's bound; 0: no clipping
};

// What a step computed over the whole batch, every rank's micro-batches together: the same on every rank.
struct StepStats {
  double loss = 0;       // the mean token loss
  double grad_norm = 0;  // the L2 norm of the gradient, before clipping
  int64_t tokens = 0;    // the tokens of the batch (EngineOptions::tokens_per_step)
};

// What a checkpoint holds beside the states: the step it was saved after and the caller's run state.
struct CheckpointInfo {
  int step = 0;
  std::string run_json = "{}";  // the JSON object given to save()
};

class Engine;

// This rank's token-loss sum of one micro-step, as Engine::forward_backward returns it. The device adds it
// up while the host goes on queueing work; reading it (value(), or a conversion to double: what callers of
// a forward_backward that returned a double get) waits for the device to finish the micro-step, as torch's
// loss.item() does. A loop that never reads it runs the whole step without the host waiting for the device
// until step(), which reads the step's sums once, at its end. Readable until the end of the step after its
// own (its value is then kept on the host); the engine must outlive it.
class MicroStepLoss {
 public:
  double value() const;
  operator double() const { return value(); }

 private:
  friend class Engine;
  MicroStepLoss(Engine& engine, int64_t step, int micro_step)
      : engine_(&engine), step_(step), micro_step_(micro_step) {}

  Engine* engine_;
  int64_t step_;  // the engine's count of ended steps when it ran
  int micro_step_;
};

// A checkpoint being written by Engine::save_async: each rank of the first shard group writes its file on
// a thread of its own while training goes on, and the manifest, the commit point, is written last, once
// every file is whole. Until then the directory is not a checkpoint: a job killed at any moment leaves the
// newest committed checkpoint as it was. A save whose engine is destroyed before it was waited for is
// given up (its writer joined, nothing committed): its test() and wait() then throw.
class AsyncSave {
 public:
  AsyncSave(AsyncSave&& other) noexcept;
  AsyncSave& operator=(AsyncSave&& other) noexcept;
  // Waits for this rank's writer and commits nothing: a save neither waited for nor tested complete is
  // not a checkpoint.
  ~AsyncSave();

  // Whether the checkpoint is committed; commits it once every rank's file is written, and never waits for
  // a writer. Every rank returns the same. Throws like wait() when a file failed. Collective.
  bool test();
  // Waits for every rank's file, then commits the checkpoint. Returns the bytes of the files. A file that
  // failed (a full disk) takes the directory with it, no manifest written, and throws on every rank.
  // Collective; returns at once when the save is committed already.
  int64_t wait();
  // Host bytes this rank holds for the save now: a copy of state on a device, or what the optimizer
  // copied ahead of the writer for state in host memory; 0 once the file is written.
  int64_t snapshot_bytes() const;
  int step() const { return step_; }  // the steps the saved state had taken
  const std::string& dir() const { return dir_; }

 private:
  friend class Engine;
  AsyncSave(Engine& engine, std::unique_ptr<AsyncCheckpoint> save);
  void release();  // this handle no longer holds the engine's save in flight

  Engine* engine_;
  std::unique_ptr<AsyncCheckpoint> save_;  // null once committed, failed or moved from
  int step_;
  std::string dir_;
  int64_t bytes_ = -1;  // once committed
};

class Engine {
 public:
  // Collective. `model` and `world` must outlive the engine; `plan` must be for world.size() ranks. With
  // CommBackend::nccl (the plan's) the engine opens an NCCL communicator over the same ranks for its
  // collectives.
  Engine(Model& model, comm::Communicator& world, const ShardPlan& plan, const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // One micro-step: forward and backward over this rank's micro-batch, adding d(sum of its token
  // losses)/d(params) / tokens_per_step into the gradients. Returns the sum of this rank's token losses
  // (step() returns the whole batch's mean) as a MicroStepLoss: it converts to the double it always was,
  // and a loop that does not read it never makes the host wait for the device between micro-steps, on a
  // GPU the difference between a busy device and one idle while the host catches up. Throws, on this rank
  // only, on a batch with a null inputs or targets pointer: like any error of one rank's own, the loop
  // must then end the job (World::abort), or its peers wait until the deadline. When the model throws (or
  // breaks the gather/grads protocol) on every rank alike, the error comes through with the step dropped,
  // as load() drops it, and the next call starts a new step; a rank's own error still ends the job.
  // Collective.
  MicroStepLoss forward_backward(const Batch& batch);
  // Forward only (evaluation): the sum of this rank's token losses; gradients and optimizer state are left
  // as they are, also when the model throws. Collective.
  double forward(const Batch& batch);
  // The mean token loss over every rank's forward() calls since the last finish_eval() (or since the
  // engine was made), the same on every rank; the next evaluation starts empty. Collective.
  double finish_eval();
  // The global L2 norm of the step's gradient, once grad_accum micro-steps have run; every rank returns
  // the same value. Reading it waits for the device, which step() alone would not do before its end: call
  // it to know the norm before the update. Collective (the first call of a step). The first call also
  // checks that the ranks' micro-batches held tokens_per_step tokens in all, and throws on every rank
  // alike when they did not, with the step dropped (its gradients too): the next call starts a new step.
  double grad_norm();
  // Ends the step: clips to hp.grad_clip by the global norm, then AdamW on the shards this rank owns, and
  // re-gathers what the strategy keeps whole. Returns the step's loss, norm and tokens. The norm, the clip
  // factor and the loss stay on the device until the step's work is queued, then the host reads them
  // once (with offload_optimizer the host steps AdamW itself, and reads them first). Throws Error on every
  // rank alike when the loss or the norm is not finite, with the weights and the optimizer state as they
  // were and the step's gradients dropped. Refuses hyper-parameters out of range (a NaN or negative lr,
  // betas outside [0, 1), ...). Collective.
  StepStats step(const AdamW& hp);
  int steps_done() const;  // optimizer steps taken (AdamW's bias correction)

  // Writes a checkpoint into directory `dir` (created; what an interrupted save left there is replaced; a
  // committed checkpoint there is refused, as the save would uncommit it before writing):
  // the fp32 master parameters and Adam state of the trainable parameters (frozen ones are named by their
  // source and fingerprint, not copied), one file per shard of the first shard group and a manifest
  // written last, the commit point. `run_json`, a JSON object, is kept in the manifest for the caller.
  // A failed save leaves no manifest and throws on every rank. Returns the bytes of the files. Collective.
  int64_t save(const std::string& dir, const std::string& run_json = "{}");
  // The same checkpoint, written while training goes on: returns once `dir` is ready and the state is
  // taken (copied to host memory when it lives on a device; state in host memory is written where it is,
  // the next steps copying only what the writer has not reached). One save at a time: a second is refused
  // while the first is neither waited for nor tested complete. Collective. Discarded, the handle could never
  // commit the checkpoint: keep it, and wait() or test() it.
  [[nodiscard]] AsyncSave save_async(const std::string& dir, const std::string& run_json = "{}");
  // Loads a checkpoint saved by any world size and strategy (each rank reads only the slices its shards
  // need) and continues from its step. Checks the model's units and the files' sizes and checksums first.
  // A checkpoint holds the trainable parameters' state only: frozen ones stay as they are, and must be
  // those it was trained beside (the same seed, or the same weights imported first), else it is refused
  // (UsageError).
  // A step in progress is dropped with its gradients once the checkpoint has passed those checks (a loop
  // recovering from a failed step loads the last checkpoint and goes on). Collective.
  CheckpointInfo load(const std::string& dir);

  // Replaces the parameters with the full weights of safetensors file `path`, named and shaped as the
  // model's parameters (Hugging Face's names for GPT-2 and Llama; a "transformer." or "model." prefix is
  // accepted, and PEFT's "base_model.model."; F32, F16, BF16 or F64). Every parameter must be there with
  // its shape, except in a base model's file, which has no LoRA adapters (they keep their values), and an
  // adapter file, which has nothing else (the base keeps its); every tensor must be a parameter's (or a
  // known buffer's). All checked before anything changes; a failure throws on every rank. A step in
  // progress is dropped with its gradients, as load() drops it; the optimizer state and the step count stay
  // as they are. Collective.
  void import_weights(const std::string& path);
  // Writes the full weights (F32, the model's names and shapes) into safetensors file `path` from rank 0:
  // what import_weights and Hugging Face read. Rank 0 writes each unit as it is gathered: no rank holds
  // more than a unit whole on the host. Collective.
  void export_weights(const std::string& path);
  // Writes the LoRA adapters alone (every `<layer>.lora_A.weight` and `.lora_B.weight`, F32) from rank 0 under
  // PEFT's names, "base_model.model." in front of the model's: what PEFT's save_pretrained writes as
  // adapter_model.safetensors, and import_weights reads back beside a base. A model without adapters is
  // refused (UsageError) on every rank. Collective.
  void export_adapters(const std::string& path);

  // Per rank and category, measured beside the ZeRO prediction; its communication per step is the mean over
  // the steps since the last reset_comm_stats(). Collective.
  MemoryReport memory_report();
  // Bytes this rank's collectives moved and the time it waited on them, since the last reset.
  comm::CommStats comm_stats() const;
  void reset_comm_stats();
  // What the last step() moved and waited (nccl: the device's stall, complete once step() returns).
  int64_t last_step_comm_bytes() const;
  double last_step_comm_exposed_ms() const;

  const ShardPlan& plan() const { return plan_; }
  const EngineOptions& options() const { return options_; }
  Model& model() { return model_; }
  comm::Communicator& world() { return world_; }

 private:
  friend class AsyncSave;
  friend class MicroStepLoss;
  friend struct EngineInternals;  // zshard's own tools and tests

  void check_batch(const char* call, const Batch& batch) const;
  static void check_adamw(const AdamW& hp);
  void run_micro_step(int k, const Batch& batch);  // the model's forward and backward
  // After an error in a step whose work a CUDA graph defers (recorded, or staged for a replay): none of it
  // ran, so the step is dropped, micro-steps and recording with it.
  void drop_deferred_step();
  StepStats take_step(const AdamW& hp);  // step() once hp is checked
  void check_micro_steps() const;  // all of the step's, before it ends
  void agree_on_step();  // collective
  // The step's sums, queued once per step after its micro-steps: the loss, the norm. Collective.
  void queue_step_sums();
  void read_step_sums();  // the host's wait for the device
  void stop_if_not_finite();  // after read_step_sums: every rank alike
  StepStats end_taken_step();  // once read_step_sums read a step that was taken
  double micro_step_loss(int64_t step, int micro_step);
  void end_step();
  void discard_step();  // its gradients too
  void give_up_save_in_flight();  // the engine is going: its save is not committed
  // The frozen parameters' fingerprint (a checkpoint names the weights it was trained beside by it),
  // computed once after they change.
  // Collective.
  const std::string& frozen_fingerprint();

  Model& model_;
  comm::Communicator& world_;
  ShardPlan plan_;
  EngineOptions options_;
  // The sharded parameters, the step, evaluation and save in progress: internal, not installed.
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace zshard
