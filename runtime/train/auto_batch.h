// zshard-train --batch auto: the global batch from a per-rank memory budget, answered before the run and
// checked by its first steps. The estimate (shard/memory/estimator.h) picks the largest per-rank
// micro-batch that fits the budget for the run's strategy, checkpointing, offload, dtypes, seq and
// grad-accum; the measured peak (the tracking allocator's, the largest over the ranks) must fit too, else
// the batch steps down one sequence per rank and the trainer is built again. Every rank decides from the
// same all-reduced values, so all take the same batch. The measurement takes the first step, or the first
// two under zero3 and hybrid without accumulation (they prefetch from the second micro-step on) unless
// --save-every 1 asks for step 1's checkpoint. Buffers that live as long as their collectives take can
// still make a later step peak a little higher.
#pragma once
#include <iosfwd>
#include <memory>

#include <zshard/communicator.h>

#include "runtime/train/trainer.h"

namespace zshard {

// Sets options.batch and returns the trainer built for it, with its measured steps taken (none when
// --steps is 0). The budget is --mem-budget, else what the set-up memory check finds usable (the least over the
// ranks) with at most default_auto_batch_tokens per rank. A budget too small for one sequence per rank
// fails on every rank with exit code 2. Rank 0 reports the choice to `out`.
std::unique_ptr<Trainer> fit_batch_to_budget(TrainOptions& options, comm::Communicator& world, std::ostream* out);

}  // namespace zshard
