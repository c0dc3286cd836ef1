#include "shard/step_graph.h"

#include <algorithm>

#include <zshard/error.h>

#include "kernels/allocator.h"
#include "kernels/option_names.h"
#include "shard/device_setup.h"

namespace zshard {

namespace {

int64_t device_bytes_live() {
  const MemStats stats = Allocator::of(Device::cuda).stats();
  int64_t live = 0;
  for (int64_t bytes : stats.live) live += bytes;
  return live;
}

bool holds(const Tensor& buffer, const Batch& batch) {
  return buffer.defined() && buffer.shape()[1] == batch.B && buffer.shape()[2] == batch.T;
}

// The batch's tokens in `buffer`, (2, B, T) in page-locked memory, made anew for another shape. The device
// read the buffer last in an earlier step or evaluation, which the host waited for at its end.
Batch copy_tokens(Tensor& buffer, const Batch& batch) {
  if (!holds(buffer, batch)) buffer = Tensor::empty({2, batch.B, batch.T}, DType::i32, Device::cpu, Category::host);
  const int64_t n = int64_t(batch.B) * batch.T;
  int32_t* inputs = buffer.data<int32_t>();
  std::copy(batch.inputs, batch.inputs + n, inputs);
  std::copy(batch.targets, batch.targets + n, inputs + n);
  return {inputs, inputs + n, batch.B, batch.T};
}

}  // namespace

void check_cuda_graphs(const Placement& placement, int world_size) {
  const std::string flag = option_setting(Option::cuda_graphs, "on", "true");
  if (placement.device != Device::cuda) refuse(flag, ": CUDA graphs record GPU work; this run is on the cpu");
  if (world_size != 1) refuse(flag, ": a step is replayed as a CUDA graph on one rank only; this run has ", world_size);
  if (placement.offload_optimizer)
    refuse(flag, ": the offloaded optimizer steps on the host, inside the step (", option_name(Option::offload), ")");
}

StepGraph::StepGraph(const Model& model, int grad_accum) : model_(model), tokens_(size_t(grad_accum)) {}

Batch StepGraph::stage(int k, const Batch& batch) {
  check_batch("forward_backward", batch, model_.vocab_size(), model_.context_length());
  if (k > 0 && !holds(tokens_[0], batch))
    fail("forward_backward: micro-step ", k, "'s batch is ", batch.B, " x ", batch.T, ", the step's first was ",
         tokens_[0].shape()[1], " x ", tokens_[0].shape()[2],
         ": with CUDA graphs a step's micro-batches have one shape");
  if (k == 0 && tokens_[0].defined() && !holds(tokens_[0], batch)) drop();
  return copy_tokens(tokens_[size_t(k)], batch);
}

Batch StepGraph::stage_evaluation(const Batch& batch) { return copy_tokens(evaluation_tokens_, batch); }

void StepGraph::begin_step() {
  if (work_.recorded()) {
    phase_ = Phase::replaying;
  } else if (plain_step_ran_) {
    live_at_begin_ = device_bytes_live();
    work_.begin();
    phase_ = Phase::recording;
  } else {
    phase_ = Phase::plain;
  }
}

void StepGraph::end_step() {
  if (phase_ == Phase::plain) {
    plain_step_ran_ = true;
    return;
  }
  if (phase_ == Phase::recording) {
    work_.end();
    // The graph frees what it allocates: a buffer it made that lived on would be freed outside it, and
    // the next replay would make it again.
    // A graph frees only what it allocated: a buffer made before the recording and released inside it
    // is not freed at all (cudaFreeAsync fails in a capture), which shows here as bytes gone.
    const int64_t grew = device_bytes_live() - live_at_begin_;
    if (grew > 0)
      fail("CUDA graphs: ", grew, " bytes of device memory allocated while the step was recorded outlive it; "
           "run without CUDA graphs");
    if (grew < 0)
      fail("CUDA graphs: ", -grew, " bytes of device memory made before the step was recorded were released "
           "inside it, which a graph cannot free; run without CUDA graphs");
    // The graph holds its step's buffers in memory of its own: what the pool kept from the plain steps'
    // goes back, or the device would hold both.
    release_cached_memory(Device::cuda);
  }
  work_.replay();
  ++replays_;
  phase_ = Phase::plain;
}

void StepGraph::drop() {
  work_.drop();
  plain_step_ran_ = false;
  phase_ = Phase::plain;
}

}  // namespace zshard
