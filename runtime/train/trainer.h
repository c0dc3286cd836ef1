// Trainer: zshard's training loop over an Engine, shared by zshard-train, the benchmarks and the tests.
// One optimizer step is `grad_accum` micro-steps over the fixed global batch, each rank taking its
// slice; then the global gradient norm, clipping, and AdamW on what each rank owns (the engine's step).
// Around it: the data, the learning-rate schedule, evaluation, the per-rank split of the batch and its
// rebalancing, progress and the JSON log.
#pragma once
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <zshard/communicator.h>
#include <zshard/engine.h>
#include <zshard/model.h>
#include <zshard/model_registry.h>

#include "comm/collective_check.h"
#include "runtime/train/data.h"
#include "runtime/cli/train_options.h"

namespace zshard {

class DeviceTimer;

struct StepResult {
  int step = 0;        // 1-based index of the optimizer step just taken
  double loss = 0;     // global mean token loss over the step's whole batch
  double grad_norm = 0;
  float lr = 0;
  double ms = 0;
  double tokens_per_s = 0;
  int64_t comm_bytes = 0;    // this rank, this step
  // Time this rank spent blocked on communication; NaN (null in JSON) where the host cannot see it.
  double comm_exposed_ms = 0;
  std::vector<int> rank_batches;  // the split of the global batch this step ran with
  double eval_loss = std::numeric_limits<double>::quiet_NaN();  // after this step; NaN: not evaluated
  // Set when --rank-batches auto re-split the batch after this step: the throughputs it went by.
  std::vector<double> resplit_seq_per_s;
};

// What a run's flags ask of the model and its input files, before anything is read or allocated: --seq
// within the model's context, --data and --eval-data files of a kind the data reads, --init-from's files of
// this model. Throws UsageError naming the flag. zshard-bench checks it before its first strategy runs.
void check_run_inputs(const TrainOptions& options, const Model& model);

class Trainer {
 public:
  // Resolves the plan first (its first collective, under --comm-timeout), then checks everything that can
  // fail on bad input (options, data, weights file headers, the memory estimate) before the engine
  // allocates, so that a bad run fails on every rank alike instead of hanging.
  Trainer(const TrainOptions& options, comm::Communicator& world);
  ~Trainer();

  StepResult step();
  // The mean token loss over --eval-batches steps' worth (--batch x --grad-accum sequences each) of
  // --eval-data, forward only, under the run's strategy; every rank returns it. Collective.
  double evaluate();
  // One step as run() takes it: timed into the ETA and logged to `out` on rank 0 (null: silent).
  StepResult run_step(std::ostream* out);
  // Runs the remaining steps; rank 0 prints progress to `out` (null: silent). `after_step`, when
  // given, runs on every rank after every step; returning false ends the run early. A step whose loss
  // or gradient norm is not finite throws AgreedFailure on every rank before the optimizer applies it.
  void run(std::ostream* out, const std::function<bool()>& after_step = {});

  int steps_done() const { return engine_->steps_done(); }
  const TrainOptions& options() const { return options_; }
  const ModelConfig& config() const { return config_; }
  Model& model() { return *model_; }
  Engine& engine() { return *engine_; }
  comm::Communicator& world() { return world_; }
  const ShardPlan& plan() const { return engine_->plan(); }
  const std::vector<StepResult>& history() const { return history_; }
  int rank_batch() const { return rank_batch_; }
  const std::vector<int>& rank_batches() const { return rank_batches_; }
  // Runs the next steps with this split (a checkpoint's, on the same world); it must sum to --batch.
  void set_rank_batches(const std::vector<int>& batches);
  // Every rank's smoothed throughput in sequences per second of compute (0 before the first step). Collective.
  std::vector<double> gathered_seq_per_s();
  // --rank-batches auto: the most sequences per micro-step each rank may take (--max-rank-batch, its
  // memory), gathered at set-up.
  const std::vector<int>& rank_batch_caps() const { return rank_batch_caps_; }

 private:
  void maybe_inject_fault(int step);
  void log_step(const StepResult& r, std::ostream* out);
  // Folds this step's compute time per sequence into the average: the micro-steps and their gradient
  // reductions on the device (`batch_ms`) less the time blocked in collectives.
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
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<comm::CollectiveCheck> collective_check_;  // --check-collectives
  std::unique_ptr<DeviceTimer> batch_timer_;  // each step's micro-steps
  std::vector<int> rank_batches_;
  std::vector<int> rank_batch_caps_;  // auto only
  int rank_batch_ = 0;
  int rank_offset_ = 0;
  double seconds_per_seq_ = 0;  // exponential moving average of compute seconds per sequence; 0: none yet
  std::vector<int32_t> inputs_, targets_;
  std::vector<StepResult> history_;
  double train_seconds_ = 0;
};

}  // namespace zshard
