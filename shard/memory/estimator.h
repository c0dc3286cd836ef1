// The memory estimator behind zshard-mem and the set-up memory check: per-rank bytes of a training run
// that was never run, from the ZeRO model-state arithmetic (zero_arithmetic.h) plus what zshard's runtime
// allocates around it: gathered units in flight, transient full-size gradient buffers, activations.
// Works from any Model (every term: its units, padded by the flat-layout code that shards them, and its
// activation_bytes in the recompute mode and attention set on it: blocks attention's (B, heads, T, T)
// probabilities, or fused attention's (B, heads, T) statistics) or from a bare parameter count (model states
// only: without units there is nothing to size the other terms from). Of the ops' short-lived scratch (the
// report's `workspace`) it counts what the model's workspace_bytes says one op holds at most (op_scratch):
// the cpu's bf16 ops' fp32 copies, blocks attention's score gradients (up to 256 MiB, or one sequence's if
// that is more), and on cuda the 32 MiB each cuBLAS call is given. Left out: the workspace of cuDNN and
// cuBLASLt (up to 32 MiB), a few bytes per token, and what a --save holds on the host: a unit whole, 4 bytes a parameter, as the ranks gather it for
// rank 0 to write (Engine::export_weights).
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <zshard/model.h>
#include <zshard/plan.h>

#include "shard/memory/zero_arithmetic.h"

namespace zshard {

struct EstimateInput {
  const Model* model = nullptr;  // null: `params` alone, model states only
  int64_t params = 0;            // Ψ; taken from the model when one is given
  // The strategy, its shard groups and prefetch depth, the dtypes, offload and device. On the cpu the
  // host is the device; on a GPU the offloaded optimizer's host bytes (with the host copy of the owned
  // gradients) are host memory beside the device's.
  ShardPlan plan;
  // Which group's ranks to estimate. -1: the rank that needs the most: one of the smallest group (the
  // largest shards) or, holding a snapshot the other groups do not, of group 0 where that needs more.
  int group = -1;
  int rank_batch = 1;  // sequences per micro-step on this rank
  int seq = 64;
  int grad_accum = 1;  // micro-steps per optimizer step
  std::vector<std::string> freeze;  // EngineOptions::freeze's patterns
  bool checkpoint_snapshot = false;  // asynchronous saves: a host copy of what the first group's ranks own, at most
  // Weights imported once set-up has made every state (Engine::import_weights, --init-from): each unit's
  // buffers read whole in fp32 on the host, one at a time, and uploaded as set-up's are.
  bool imports_weights = false;
};

struct MemoryEstimate {
  Device device = Device::cpu;
  int shard_group = 1;
  int64_t params = 0;  // Ψ, frozen ones included
  int64_t frozen_params = 0;
  ModelStateBytes model_states;
  int64_t gathered_in_flight = 0;  // full parameter units alive at once (zero3/hybrid)
  int64_t comm_buffers = 0;        // transient full-size gradients and reduce-scatter outputs
  int64_t activations = 0;
  // The most one op holds at once (Model::workspace_bytes): on the cpu in bf16 the fp32 copies of the
  // widest op's block (at most kernels/cpu/ops.h's kOpScratchBytes, the cross-entropy's losses beside).
  // The step's total adds it where it falls: an op before the step's first reduction (the forward, a head)
  // beside the gradients open by then (comm_before_reductions: a kept one and the unit being accumulated,
  // under sharded gradients), one in the backward of the unit made ready last (op_scratch_last_unit: an
  // embedding's, a deferred head's) beside the other units' reductions (comm_at_last_unit), and the others
  // (op_scratch_reducing) beside every communication buffer.
  int64_t op_scratch = 0;
  int64_t op_scratch_reducing = 0;
  int64_t op_scratch_last_unit = 0;
  int64_t comm_before_reductions = 0;
  int64_t comm_at_last_unit = 0;
  // Asynchronous saves: the fp32 master and Adam m and v a rank of the first shard group copies into host
  // memory (page-locked on a GPU) for its writer, at most: state already in host memory is copied only
  // where training overtakes the writer. The other groups' ranks write nothing.
  int64_t checkpoint_snapshot = 0;
  // Set-up's peak: the model states made so far beside the fp32 staging of the unit being initialised (none
  // where its own buffers hold it whole in fp32 on the cpu); with imported weights, every state beside the
  // largest buffer read in. It exceeds the step's where a unit's staging outweighs the activations and
  // buffers of a step: a large frozen embedding under LoRA in bf16, say.
  int64_t set_up = 0;
  // Host memory that is not the device's: on a GPU the offloaded optimizer's and the snapshot.
  int64_t host_apart() const { return device == Device::cpu ? 0 : model_states.host + checkpoint_snapshot; }
  // The peak of a training step (on the cpu, host bytes included): what a benchmark measures, its peaks
  // reset after set-up.
  int64_t step_total() const {
    return model_states.total() + checkpoint_snapshot - host_apart() + gathered_in_flight + activations +
           std::max({comm_before_reductions + op_scratch, comm_buffers + op_scratch_reducing,
                     comm_at_last_unit + op_scratch_last_unit});
  }
  // The device's peak over a run, set-up's included: what budgets are checked against.
  int64_t total() const { return std::max(step_total(), set_up); }
};

// Throws UsageError for a group that the plan does not have.
MemoryEstimate estimate_memory(const EstimateInput& in);

// The largest per-rank micro-batch whose estimate fits in `device_bytes` (0 when not even one sequence
// fits, or without a model, -1: activations unknown).
int largest_rank_batch(EstimateInput in, int64_t device_bytes);

// The memory savers zshard-mem --max-batch compares: activation checkpointing and optimizer offload.
struct MemorySavers {
  Recompute recompute = Recompute::none;
  bool offload_optimizer = false;
  std::string name() const;  // "none", "blocks", "offload", "blocks+offload"
};
inline constexpr MemorySavers kAllMemorySavers[] = {{Recompute::none, false},
                                                    {Recompute::blocks, false},
                                                    {Recompute::none, true},
                                                    {Recompute::blocks, true}};

// largest_rank_batch for each of kAllMemorySavers, in that order, on `model` (whose recompute mode it
// sets in turn and leaves at none): -1 where the model cannot recompute its blocks. On the cpu the
// offloaded host bytes count against `budget` like the rest (the host is the device); on a GPU they do not.
std::vector<int> largest_rank_batch_per_saver(EstimateInput in, Model& model, int64_t budget);

// "1.50 GB", "12.30 MB", "4.0 kB" (decimal units, as the tools print them).
std::string format_bytes(double bytes);

}  // namespace zshard
