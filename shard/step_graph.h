// An engine's steps replayed as CUDA graphs (EngineOptions::cuda_graphs): the host's hundreds of launches a
// step (every micro-step's forward and backward, the norm, the clip, AdamW) become one graph launch, so a
// GPU that finishes small kernels faster than the host queues them no longer waits for the host.
//
// A step is recorded once a plain step has built what every step reuses (the model's activation buffers,
// cuBLASLt's and cuDNN's plans), and replayed from then on: forward_backward then runs no model code and
// only stages the micro-batch's tokens, and step() launches the graph. What a replay must see anew lives
// where the recorded copies read it: the tokens in page-locked buffers kept here, AdamW's learning rate
// and bias corrections and the clip bound in the engine's page-locked settings (ops::set_step_settings).
// Anything that may move a buffer the recording reads (an evaluation, a load) drops it, and the step after
// the next plain one records again.
#pragma once
#include <cstdint>
#include <vector>

#include <zshard/model.h>
#include <zshard/plan.h>
#include <zshard/tensor.h>

#include "kernels/graph_capture.h"

namespace zshard {

// Refuses (UsageError) a run whose steps cannot be one graph each: one on the cpu, or on more than one rank
// or with the offloaded optimizer, whose collectives and host AdamW run between the device's pieces of a
// step. The engine checks; the tools check first, at set-up.
void check_cuda_graphs(const Placement& placement, int world_size);

class StepGraph {
 public:
  StepGraph(const Model& model, int grad_accum);

  // Micro-step k's batch as the model reads it: its tokens checked against the model's vocabulary and
  // context (a replay runs no model code that would) and copied to page-locked buffers the device reads
  // from. At micro-step 0 a batch of another shape than the recording's drops it; later micro-steps of a
  // step must have the first one's shape.
  Batch stage(int k, const Batch& batch);
  // An evaluation's batch, copied to page-locked memory of its own: the model then never waits on the
  // token copies' host marks, which a recording leaves unreadable.
  Batch stage_evaluation(const Batch& batch);
  // At micro-step 0: what this step is. Recording starts here when the step is due for it.
  void begin_step();
  // True between begin_step and end_step when the step is a replay: forward_backward runs no model code,
  // step() queues nothing of its own.
  bool replaying() const { return phase_ == Phase::replaying; }
  // True while the step's device work is not queued yet (recorded or to be replayed): nothing may read
  // the device until end_step.
  bool deferred() const { return phase_ != Phase::plain; }
  // After the step's work is queued: ends a recording (refusing one whose buffers outlive it) and
  // replays it, or replays the recording.
  void end_step();
  // Forgets the recording, and a step being recorded or staged for a replay with it (the caller drops
  // that step's micro-steps); the next plain step is followed by a recording.
  void drop();
  int64_t replays() const { return replays_; }

 private:
  enum class Phase { plain, recording, replaying };
  const Model& model_;
  std::vector<Tensor> tokens_;  // per micro-step: (2, B, T) i32, page-locked, inputs then targets
  Tensor evaluation_tokens_;
  bool plain_step_ran_ = false;  // since the recording was last dropped: the next step may be recorded
  Phase phase_ = Phase::plain;
  int64_t live_at_begin_ = 0;  // device bytes live when the recording began
  int64_t replays_ = 0;
  CapturedWork work_;
};

}  // namespace zshard
