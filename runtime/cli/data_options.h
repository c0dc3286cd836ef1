// What each step reads, and its flags: --data, the batch and its split among the ranks (--batch N|auto
// with the memory it is sized and checked against, --seq, --grad-accum, --rank-batches), and the held-out
// evaluation (--eval-data, --eval-every, --eval-batches).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <zshard/dtype.h>

#include "runtime/cli/cli_fwd.h"

namespace zshard {

// --grad-accum's bound: a step's micro-step losses are held until it ends, 8 bytes each.
inline constexpr int kMaxGradAccum = 1 << 20;

struct DataOptions {
  std::string source = "default";  // --data
  int batch = 8;  // global sequences per micro-step
  int seq = 64;
  int grad_accum = 1;
  // --batch auto: zshard-train sets `batch` to the largest that fits --mem-budget (runtime/train/auto_batch.h).
  bool auto_batch = false;
  std::string mem_budget;  // --mem-budget SIZE, per rank; empty: what the memory check finds usable
  bool mem_check = true;   // refuse at set-up a run whose estimate exceeds the memory available
  std::vector<int> rank_batches;  // per-rank share of --batch; empty = even split (or auto)
  // --rank-batches auto: start even, then every `rebalance_every` steps (0: never; unset: 5) re-split by
  // each rank's measured speed, each rank within `max_rank_batch` (unset: what its memory allows). Both
  // are refused without auto, where they would do nothing.
  bool rank_batches_auto = false;
  std::optional<int> rebalance_every;
  std::optional<int> max_rank_batch;
  int rebalance_interval() const { return rebalance_every.value_or(5); }
};

// --batch auto without --mem-budget: the memory allows far more than pays on a small model (the tiny
// model fitted 26,331 sequences in a host's memory, a minute per step), so the batch takes at most this
// many tokens per rank and micro-step, past which a device's throughput no longer grows
// (benchmarks/RESULTS.md).
int64_t default_auto_batch_tokens(Device device);

// Every `every` steps (0: never) and after the last one, the mean token loss of the model over the first
// `batches` global batches of `source` (forward only, the run's batch and seq).
struct EvalOptions {
  std::string source;  // --eval-data
  int every = 0;
  int batches = 4;
};

void add_data_flags(CLI::App& app, DataOptions& options);
void add_eval_flags(CLI::App& app, EvalOptions& options);

// Checks what needs no data and no model, on `world_size` ranks; throws UsageError naming the flag.
void validate(const DataOptions& options, int world_size);
void validate(const EvalOptions& options);

// Sequences of the global batch per rank: --rank-batches, or an even split with the remainder on the
// first ranks (also where auto starts). The gradient stays the exact global mean whatever the split.
std::vector<int> split_batch(const DataOptions& options, int world_size);

}  // namespace zshard
