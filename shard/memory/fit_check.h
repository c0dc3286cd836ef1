// The check zshard-train and zshard-bench run at set-up, before the first large allocation: the
// estimator's peak for this rank (shard/memory/estimator.h) against the memory the rank can
// use. A run that cannot fit is refused in one line with the estimate, the memory available and the
// nearest configuration that fits, instead of allocating until the kernel's OOM killer ends it without a
// word.
#pragma once
#include <cstdint>
#include <string>

#include <zshard/model.h>
#include <zshard/plan.h>

#include "shard/memory/estimator.h"

namespace zshard {

struct MemoryBudget {
  int64_t bytes = -1;  // -1: unknown, nothing is checked
  std::string source;  // how it was found, for the message
};

// The batch of a run, as the memory check sizes it and the alternatives it suggests.
struct BatchShape {
  int batch = 8;  // global sequences per micro-step
  int seq = 64;
  int grad_accum = 1;
  bool even = true;  // an even split; false: sizes fixed per rank (--rank-batches), not cut further
  bool checkpoint_snapshot = false;  // asynchronous saves' host copy, beside the batch (EstimateInput's)
  std::vector<std::string> freeze;   // EngineOptions::freeze: what has no gradient or optimizer state
  bool imports_weights = false;      // --init-from: weights read in after set-up (EstimateInput's)
};

// What one rank may allocate. cuda: the device's free memory, shared among the ranks using the device.
// cpu: MemAvailable, or what the cgroup limit leaves if that is less, shared among this host's ranks.
MemoryBudget usable_memory(Device device, int ranks_on_host);

// What the estimator needs of a run: its plan, and `rank_batch` sequences of its shape.
EstimateInput estimate_input(const ShardPlan& plan, const Model& model, const BatchShape& shape, int rank_batch);

// The most sequences per micro-step this rank can take within `budget` with the run's settings (0: not
// even one; -1: the budget is unknown).
int largest_rank_batch_fitting(const ShardPlan& plan, const Model& model, const BatchShape& shape,
                               const MemoryBudget& budget);

// On a GPU with --offload optimizer or asynchronous saves: throws zshard::Error when this rank's page-locked
// host memory (master, Adam state and the gradients' host copy; an asynchronous save's snapshot; neither
// changes with the batch) exceeds `host_budget`, what the host has per rank (usable_memory(Device::cpu,
// ...)). Page-locked memory cannot be swapped out, so a host
// that overcommits it stalls or is ended by the OOM killer. Does nothing elsewhere.
void check_host_memory_fits(const ShardPlan& plan, const Model& model, const BatchShape& shape,
                            const MemoryBudget& host_budget);

// Throws zshard::Error when the estimate for this rank (its `rank_batch` sequences) exceeds `budget`.
// `largest_rank_batch` sizes the suggestion, which keeps the global batch (a smaller micro-batch with
// more accumulation) and tries the strategies that shard more.
void check_memory_fits(const ShardPlan& plan, const Model& model, const BatchShape& shape, int rank_batch,
                       int largest_rank_batch, const MemoryBudget& budget);

}  // namespace zshard
