// The engine: a model sharded across the world's ranks by a plan, driven by a training loop of zshard's
// (train_main, zshard-train) or of your own, as FSDP2's fully_shard and DeepSpeed's engine are:
//
//   zshard::World world(&argc, &argv);                       // mpirun/srun ranks, or one process
//   const zshard::ShardPlan plan = zshard::resolve_plan({.strategy = {zshard::StrategyKind::zero3}}, world.comm());
//   zshard::Engine engine(model, world.comm(), plan, {.grad_accum = 1, .tokens_per_step = B * T});
//   for (...) {
//     const double loss_sum = engine.forward_backward(my_batch);   // this rank's share of the step's batch
//     engine.step({.lr = my_schedule(step)});                      // clip, AdamW on what this rank owns
//   }
//   engine.save("ck/step-100");                                    // resumes on any world size: load()
//
// The model never knows the strategy: the engine owns every unit's parameters, gradients and AdamW state
// as the plan prescribes and implements the model API's gather/release/grads/grads_ready (model.h).
// Every call that says "collective" must be made by every rank of the world, in the same order.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include <zshard/communicator.h>
#include <zshard/memory_report.h>
#include <zshard/model.h>
#include <zshard/plan.h>

namespace zshard {

class ShardedParams;

struct EngineOptions {
  uint64_t seed = 1337;  // initial parameters: the model's init_unit(u, ..., seed), the same on any world
  // Micro-steps per optimizer step: forward_backward calls before each step(). ddp and zero1 reduce
  // gradients on the last one only (no_sync); the sharded strategies reduce every micro-step.
  int grad_accum = 1;
  // Tokens of all ranks' micro-batches of one step together: the gradient is the mean over them, exactly,
  // whatever the split of the batch among the ranks.
  int64_t tokens_per_step = 0;
};

// AdamW's hyper-parameters for one step (PyTorch's AdamW, with torch.nn.utils.clip_grad_norm_ before it).
struct AdamW {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // decoupled; matrices and embeddings only (ParamSpec::weight_decay)
  float grad_clip = 1.0f;     // the global gradient norm's bound; 0: no clipping
};

// What a checkpoint holds beside the states: the step it was saved after and the caller's run state.
struct CheckpointInfo {
  int step = 0;
  std::string run_json = "{}";  // the JSON object given to save()
};

class Engine {
 public:
  // Collective. `model` and `world` must outlive the engine; `plan` must be for world.size() ranks. With
  // --comm nccl (the plan's) the engine opens an NCCL communicator over the same ranks for its collectives.
  Engine(Model& model, comm::Communicator& world, const ShardPlan& plan, const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // One micro-step: forward and backward over this rank's micro-batch, adding d(sum of its token
  // losses)/d(params) / tokens_per_step into the gradients. Returns the sum of this rank's token losses.
  // Throws, on this rank only, on a batch with a null inputs or targets pointer: like any error of one
  // rank's own, the loop must then end the job (World::abort), or its peers wait until the deadline.
  // Collective.
  double forward_backward(const Batch& batch);
  // Forward only (evaluation): the sum of this rank's token losses; gradients and optimizer state are left
  // as they are. Collective.
  double forward(const Batch& batch);
  // The global L2 norm of the step's gradient, once grad_accum micro-steps have run; every rank returns
  // the same value. Collective (the first call of a step). The first call also checks that the ranks'
  // micro-batches held tokens_per_step tokens in all, and throws on every rank alike when they did not.
  double grad_norm();
  // Ends the step: clips to hp.grad_clip by the global norm, then AdamW on the shards this rank owns, and
  // re-gathers what the strategy keeps whole. Returns the norm. Throws Error on every rank alike, before
  // anything is updated, when the norm is not finite. Refuses hyper-parameters out of range (a NaN or
  // negative lr, betas outside [0, 1), ...). Collective.
  double step(const AdamW& hp);
  int steps_done() const { return steps_done_; }  // optimizer steps taken (AdamW's bias correction)

  // Writes a checkpoint into directory `dir` (created; what an interrupted save left there is replaced; a
  // committed checkpoint there is refused, as the save would uncommit it before writing):
  // the fp32 master parameters and Adam state, one file per shard of the first shard group and a manifest
  // written last, the commit point. `run_json`, a JSON object, is kept in the manifest for the caller.
  // A failed save leaves no manifest and throws on every rank. Returns the bytes of the files. Collective.
  int64_t save(const std::string& dir, const std::string& run_json = "{}");
  // Loads a checkpoint saved by any world size and strategy (each rank reads only the slices its shards
  // need) and continues from its step. Checks the model's units and the files' sizes and checksums first.
  // A step in progress is dropped with its gradients (a loop recovering from a failed step loads the last
  // checkpoint and goes on). Collective.
  CheckpointInfo load(const std::string& dir);

  // Per rank and category, measured beside the ZeRO prediction. Collective.
  MemoryReport memory_report();
  // Bytes this rank's collectives moved and the time it waited on them, since the last reset.
  comm::CommStats comm_stats() const;
  void reset_comm_stats();
  // What the last step() moved and waited (nccl: the device's stall, complete once step() returns).
  int64_t last_step_comm_bytes() const { return last_step_comm_bytes_; }
  double last_step_comm_exposed_ms() const { return last_step_exposed_ms_; }

  const ShardPlan& plan() const { return plan_; }
  const EngineOptions& options() const { return options_; }
  Model& model() { return model_; }
  comm::Communicator& world() { return world_; }
  // The world-sized communicator the engine's collectives run on: the NCCL one, or the world.
  comm::Communicator& collective_world() { return device_comm_ ? *device_comm_ : world_; }
  // zshard's own tools and tests reach the sharded state here; its type is not part of the public API.
  ShardedParams& params() { return *params_; }

 private:
  void check_batch(const char* call, const Batch& batch) const;
  static void check_adamw(const AdamW& hp);
  void check_step_tokens();  // collective
  void end_step();
  void discard_step();  // its gradients too

  Model& model_;
  comm::Communicator& world_;
  ShardPlan plan_;
  EngineOptions options_;
  std::unique_ptr<comm::Communicator> device_comm_;  // nccl: what params_'s groups split from (outlives them)
  std::unique_ptr<ShardedParams> params_;
  int micro_steps_ = 0;  // of the step in progress
  int64_t step_tokens_ = 0;  // this rank's B x T of the step in progress
  int steps_done_ = 0;
  double step_norm_ = -1;  // the step's norm once computed (grad_norm), else negative
  comm::CommStats step_start_;
  int64_t last_step_comm_bytes_ = 0;
  double last_step_exposed_ms_ = 0;
  // Every step's (bytes, exposed ms), for the memory report's per-step means.
  std::vector<std::pair<int64_t, double>> step_comm_;
};

}  // namespace zshard
