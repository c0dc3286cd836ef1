// The memory report of a run: per rank and category, live and peak bytes read from the tracking allocator,
// beside the ZeRO prediction for the strategy, world size and dtypes; and communication bytes per step
// measured by the communicator beside theory. On a GPU the categories are the device's, except `host`: the
// offloaded optimizer's page-locked host memory, from the host's allocator. Engine::memory_report()
// collects it.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include <zshard/memory.h>

namespace zshard {

// Model-state bytes per rank: what the ZeRO formulas count.
struct ModelStateBytes {
  int64_t params = 0;
  int64_t frozen = 0;  // frozen parameters' compute copy (ParamSpec::frozen)
  int64_t grads = 0;
  int64_t optimizer = 0;
  // --offload optimizer: the fp32 master and Adam m and v in host memory, and on a GPU the host copy of
  // the owned gradients
  int64_t host = 0;
  int64_t total() const { return params + frozen + grads + optimizer + host; }
  int64_t on_device() const { return params + frozen + grads + optimizer; }
};

struct RankMemory {
  MemStats stats;
  double comm_bytes_per_step = 0;
  double comm_exposed_ms_per_step = 0;
  // The prediction for this rank's shard group (unequal groups hold shards of different sizes).
  int shard_group = 1;
  ModelStateBytes predicted;
  int64_t predicted_comm_bytes = 0;
};

struct MemoryReport {
  std::string strategy;
  std::string device;  // where the measured bytes live; the prediction follows the param dtype
  std::string param_dtype;
  std::string reduce_dtype;
  int world = 1;
  int shard_group = 1;       // rank 0's group
  std::vector<int> shard_group_sizes;  // every group's, in rank order
  std::vector<int> secondary_group_sizes;  // zero3 with --secondary-shard: every secondary group's; else empty
  int64_t params = 0;  // Ψ, frozen ones included
  int64_t frozen_params = 0;  // of which frozen: a compute copy each, no gradient or optimizer state
  ModelStateBytes predicted;  // for rank 0's group; each rank's in RankMemory
  ModelStateBytes predicted_zero_offload;  // with --offload optimizer: ZeRO-Offload's own split, beside it
  int64_t predicted_inflight = 0;  // largest gathered units in flight (sharded params), an estimate
  int64_t predicted_comm_bytes = 0;  // rank 0's
  // --save-mode async: the host snapshot of a rank of the first shard group, set by the caller that saves.
  int64_t predicted_checkpoint_snapshot = 0;
  std::vector<RankMemory> ranks;

  // Max over the ranks of groups of `group_size` (0: all ranks) of the measured live model-state bytes
  // (params + frozen + grads + optimizer + host).
  int64_t measured_model_states(int group_size = 0) const;
  // Max over the ranks of the host category's peak above its live bytes: the snapshot of an asynchronous
  // save, freed once written, beside host memory that lives as long as the run (the offloaded optimizer).
  int64_t measured_checkpoint_snapshot() const;
  void print(std::ostream& out) const;
  std::string to_json(int indent = -1) const;  // a JSON document (zshard-train --mem-report writes it)
};

}  // namespace zshard
