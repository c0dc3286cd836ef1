// The Engine's state beside its model, world, plan and options: the sharded parameters and their
// communicators, the step in progress and its sums, the evaluation's sums and the save in flight. Kept out
// of the installed <zshard/engine.h>; the engine's own sources (engine*.cpp, async_checkpoint.cpp) and
// EngineInternals include it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <zshard/engine.h>

#include "shard/sharded_params.h"
#include "shard/step_graph.h"

namespace zshard {

struct Engine::State {
  std::unique_ptr<comm::Communicator> device_comm_;  // nccl: what params_'s groups split from (outlives them)
  std::unique_ptr<ShardedParams> params_;
  std::unique_ptr<StepGraph> graph_;  // with EngineOptions::cuda_graphs
  std::string frozen_source_;       // where the frozen parameters came from: "seed N", or a weights file
  std::string frozen_fingerprint_;  // empty until computed
  AsyncCheckpoint* save_in_flight_ = nullptr;  // owned by its AsyncSave
  int micro_steps_ = 0;  // of the step in progress
  int64_t step_tokens_ = 0;  // this rank's B x T of the step in progress
  int steps_done_ = 0;
  int64_t steps_ended_ = 0;  // steps taken or dropped (a load): which step a MicroStepLoss is of
  // On the device: the step's scalars, each micro-step's loss sum, this rank's part of
  // the squared norm and every rank's.
  Tensor step_sums_;
  std::vector<double> returned_losses_;  // per micro-step, what the model returned (0 where it added on the device)
  // The step's settings (AdamW's factors, the clip bound), where ops::set_step_settings copies them from:
  // page-locked host memory on a device (empty on cpu, which sets them directly).
  Tensor step_settings_;
  bool sums_queued_ = false;
  // The scalars and each micro-step's loss as last read back, and which step they are of (-1: none yet).
  std::vector<double> read_sums_;
  int64_t read_step_ = -1;
  std::vector<double> previous_losses_;  // the micro-step losses of read_step_ before its last read
  int64_t previous_step_ = -1;
  double eval_loss_sum_ = 0;  // this rank's forward() token losses since the last finish_eval()
  int64_t eval_tokens_ = 0;
  comm::CommStats step_start_;
  int64_t last_step_comm_bytes_ = 0;
  double last_step_exposed_ms_ = 0;
  // Every step's (bytes, exposed ms), for the memory report's per-step means.
  std::vector<std::pair<int64_t, double>> step_comm_;
};

}  // namespace zshard
