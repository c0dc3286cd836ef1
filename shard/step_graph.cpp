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

}  // namespace

void check_cuda_graphs(const Placement& placement, int world_size) {
  const std::string flag = option_setting(Option::cuda_graphs, "on", "true");
  if (placement.device != Device::cuda) refuse(flag, ": CUDA graphs record GPU work; this run is on the cpu");
  if (world_size != 1) refuse(flag, ": a step is replayed as a CUDA graph on one rank only; this run has ", world_size);
  if (placement.offload_optimizer)
    refuse(flag, ": the offloaded optimizer steps on the host, inside the step (", option_name(Option::offload), ")");
}

StepGraph::StepGraph(const Model& model, int grad_accum) : model_(model), grad_accum_(grad_accum) {}

Batch StepGraph::stage(int k, const Batch& batch) {
  check_batch("forward_backward", batch, model_.vocab_size(), model_.context_length());
  const int64_t n = int64_t(batch.B) * batch.T;
  if (!tokens_.defined() || tokens_.shape()[2] != batch.B || tokens_.shape()[3] != batch.T) {
    if (k > 0)
      fail("forward_backward: micro-step ", k, "'s batch is ", batch.B, " x ", batch.T, ", the step's first was ",
           tokens_.shape()[2], " x ", tokens_.shape()[3], ": with CUDA graphs a step's micro-batches have one shape");
    drop();
    tokens_ = Tensor::empty({grad_accum_, 2, batch.B, batch.T}, DType::i32, Device::cpu, Category::host);
  }
  // The device read this micro-step's buffers in the last step, which the host waited for at its end.
  int32_t* inputs = tokens_.data<int32_t>() + size_t(k) * 2 * size_t(n);
  int32_t* targets = inputs + n;
  std::copy(batch.inputs, batch.inputs + n, inputs);
  std::copy(batch.targets, batch.targets + n, targets);
  return {inputs, targets, batch.B, batch.T};
}

void StepGraph::begin_step() {
  if (work_.recorded()) {
    phase_ = Phase::replaying;
  } else if (plain_steps_ >= 1) {
    phase_ = Phase::recording;
    live_at_begin_ = device_bytes_live();
    work_.begin();
  } else {
    phase_ = Phase::plain;
  }
}

void StepGraph::end_step() {
  const Phase phase = phase_;
  phase_ = Phase::plain;
  if (phase == Phase::plain) {
    ++plain_steps_;
    return;
  }
  if (phase == Phase::recording) {
    work_.end();
    // The graph frees what it allocates: a buffer it made that lived on would be freed outside it, and
    // the next replay would make it again.
    if (const int64_t grew = device_bytes_live() - live_at_begin_; grew != 0) {
      drop();
      fail("CUDA graphs: ", grew, " bytes of device memory allocated while the step was recorded outlive it; "
           "run without CUDA graphs");
    }
    // The graph holds its step's buffers in memory of its own: what the pool kept from the plain steps'
    // goes back, or the device would hold both.
    release_cached_memory(Device::cuda);
  }
  work_.replay();
}

void StepGraph::drop() {
  work_.drop();
  plain_steps_ = 0;
}

}  // namespace zshard
