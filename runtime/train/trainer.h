// Trainer: the step loop shared by zshard-train, the benchmarks and the tests. One optimizer step is
// `grad_accum` micro-steps over the fixed global batch, each rank taking its slice; then the global
// gradient norm, clipping, and AdamW on what each rank owns.
#pragma once
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <zshard/communicator.h>
#include <zshard/lr_schedule.h>
#include <zshard/model.h>
#include <zshard/model_registry.h>

#include "comm/collective_check.h"
#include "runtime/train/data.h"
#include "shard/device_setup.h"
#include "shard/sharded_params.h"
#include "shard/strategy.h"

namespace zshard {

struct TrainOptions {
  // model
  std::string model = "tiny";  // a name of the model registry (<zshard/model_registry.h>)
  ModelConfig overrides;       // replace the named configuration's values (--config, --layers, --dim, ...)
  std::string init_from;       // safetensors with the model's parameter names
  // data and batch
  std::string data = "default";
  int batch = 8;  // global sequences per micro-step
  // --batch auto: zshard-train sets `batch` to the largest that fits --mem-budget (runtime/train/auto_batch.h).
  bool auto_batch = false;
  std::string mem_budget;  // --mem-budget SIZE, per rank; empty: what the memory check finds usable, capped in tokens
  int seq = 64;
  int grad_accum = 1;
  std::vector<int> rank_batches;  // per-rank share of --batch; empty = even split (or auto)
  // --rank-batches auto: start even, then every `rebalance_every` steps (0: never; unset: 5) re-split by
  // each rank's measured speed, each rank within `max_rank_batch` (unset: what its memory allows). Both
  // are refused without auto, where they would do nothing.
  bool rank_batches_auto = false;
  std::optional<int> rebalance_every;
  std::optional<int> max_rank_batch;
  int rebalance_interval() const { return rebalance_every.value_or(5); }
  // optimizer
  int steps = 300;
  float lr = 3e-3f;
  int warmup = 0;
  std::string lr_schedule = "cosine";
  float min_lr = 0.0f;
  float wd = 0.1f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float grad_clip = 1.0f;
  uint64_t seed = 1337;
  // runtime
  StrategyOptions strategy;
  Placement placement;              // --device, --param-dtype, --reduce-dtype
  std::optional<CommBackend> comm;  // --comm; unset: nccl on cuda, mpi on cpu
  double comm_timeout_s = 300;
  std::string trace_dir;           // --trace-dir: where each rank dumps its last collectives (comm/flight_recorder.h)
  bool check_collectives = false;  // --check-collectives (comm/collective_check.h)
  bool mem_check = true;  // refuse at set-up a run whose estimate exceeds the memory available
  // What the model keeps for backward; changes memory and compute, never the results.
  ActivationCheckpointing activation_checkpointing = ActivationCheckpointing::none;
  // evaluation: every `eval_every` steps (0: never) and after the last one, the mean token loss of the
  // model over the first `eval_batches` global batches of `eval_data` (forward only, same batch and seq)
  std::string eval_data;
  int eval_every = 0;
  int eval_batches = 4;
  // output
  std::string log_json;
  std::string save;
  std::string mem_report;
  int log_every = 10;
  // checkpoints (runtime/train/save_policy.h)
  std::string save_dir;
  int save_every = 0;  // 0: only the final save
  int keep = 0;        // 0: keep every checkpoint
  std::string resume;  // a checkpoint directory, or "latest": the newest one in save_dir
};

// How --param-dtype and --reduce-dtype spell a dtype: fp32, bf16.
std::string_view dtype_flag(DType dtype);
// How --activation-checkpointing spells a mode: none, blocks.
std::string_view checkpointing_flag(ActivationCheckpointing mode);

// Checks every option that does not need the data or the model; throws UsageError naming the flag.
void validate_options(const TrainOptions& options, int world_size);
// The registered configuration of --model with the overrides; UsageError naming the flag.
ModelConfig resolve_model_config(const TrainOptions& options);
CommBackend comm_backend(const TrainOptions& options);  // --comm, or its default for --device

struct StepResult {
  int step = 0;        // 1-based index of the optimizer step just taken
  double loss = 0;     // global mean token loss over the step's whole batch
  double grad_norm = 0;
  float lr = 0;
  double ms = 0;
  double tokens_per_s = 0;
  int64_t comm_bytes = 0;    // this rank, this step
  // Time this rank spent blocked on communication; NaN (null in JSON) where the host cannot see it
  // (nccl, see Trainer::step).
  double comm_exposed_ms = 0;
  std::vector<int> rank_batches;  // the split of the global batch this step ran with
  double eval_loss = std::numeric_limits<double>::quiet_NaN();  // after this step; NaN: not evaluated
  // Set when --rank-batches auto re-split the batch after this step: the throughputs it went by.
  std::vector<double> resplit_seq_per_s;
};

class Trainer {
 public:
  // Everything that can fail on bad input (options, data, weights file headers) is checked before the
  // first collective, so a bad run fails on every rank alike instead of hanging.
  Trainer(const TrainOptions& options, comm::Communicator& world);
  ~Trainer();

  StepResult step();
  // The mean token loss over --eval-batches global batches of --eval-data, forward only, under the run's
  // strategy; every rank returns it. Collective.
  double evaluate();
  // One step as run() takes it: timed into the ETA and logged to `out` on rank 0 (null: silent).
  StepResult run_step(std::ostream* out);
  // Runs the remaining steps; rank 0 prints progress to `out` (null: silent). `after_step`, when
  // given, runs on every rank after every step; returning false ends the run early. A step whose loss
  // or gradient norm is not finite throws AgreedFailure on every rank before the optimizer applies it.
  void run(std::ostream* out, const std::function<bool()>& after_step = {});
  // Continues after `steps` steps (from a checkpoint): the LR schedule, the data position and AdamW's
  // bias correction all follow from the step count.
  void restore_steps_done(int steps) { steps_done_ = steps; }

  int steps_done() const { return steps_done_; }
  const TrainOptions& options() const { return options_; }
  const ModelConfig& config() const { return config_; }
  Model& model() { return *model_; }
  ShardedParams& params() { return *params_; }
  // The launch's world, for host-buffer collectives; with nccl the params' own run on another one.
  comm::Communicator& world() { return world_; }
  // The world-sized communicator the params' collectives run on: the nccl one, or the world.
  comm::Communicator& collective_world() { return device_comm_ ? *device_comm_ : world_; }
  const std::vector<StepResult>& history() const { return history_; }
  int rank_batch() const { return rank_batch_; }
  int rank_offset() const { return rank_offset_; }
  const std::vector<int>& rank_batches() const { return rank_batches_; }
  // Runs the next steps with this split (a checkpoint's, on the same world); it must sum to --batch.
  void set_rank_batches(const std::vector<int>& batches);
  // Every rank's smoothed throughput in sequences per second of compute (0 before the first step). Collective.
  std::vector<double> gathered_seq_per_s();
  // --rank-batches auto: the most sequences per micro-step each rank may take (--max-rank-batch, its
  // memory), gathered at set-up.
  const std::vector<int>& rank_batch_caps() const { return rank_batch_caps_; }

  // Writes the consolidated model (the model's parameter names and shapes, F32) from rank 0. Collective.
  void save_weights(const std::string& path);

 private:
  void load_weights(const std::string& path);
  void maybe_inject_fault(int step);
  void log_step(const StepResult& r, std::ostream* out);
  // Folds this step's compute time per sequence into the average: the micro-steps and the gradient
  // reduction (`batch_ms`) less the time blocked in collectives.
  void measure_speed(double batch_ms, double waited_ms);
  // --rank-batches auto, every --rebalance-every steps: the split every rank computes from the gathered
  // speeds. Returns the gathered throughputs when the split changed (empty otherwise). Collective.
  std::vector<double> maybe_rebalance();
  // --log-json, all steps so far, written at once when the run ends (also on a stop signal or a
  // non-finite step), so the file is complete or absent. Collective.
  void write_log_json();

  TrainOptions options_;
  comm::Communicator& world_;
  ModelConfig config_;
  TokenDataset data_;
  TokenDataset eval_data_;  // --eval-data; empty without it
  std::unique_ptr<Model> model_;
  std::unique_ptr<comm::Communicator> device_comm_;  // nccl: what params_'s groups split from (outlives them)
  std::unique_ptr<ShardedParams> params_;
  std::unique_ptr<comm::CollectiveCheck> collective_check_;  // --check-collectives
  LrSchedule schedule_;
  std::vector<int> rank_batches_;
  std::vector<int> rank_batch_caps_;  // auto only
  int rank_batch_ = 0;
  int rank_offset_ = 0;
  double seconds_per_seq_ = 0;  // exponential moving average of compute seconds per sequence; 0: none yet
  int steps_done_ = 0;
  std::vector<int32_t> inputs_, targets_;
  std::vector<StepResult> history_;
  double train_seconds_ = 0;
};

}  // namespace zshard
