// What each relaunch trains with. A step's sequences are fixed (--batch x --grad-accum of the command) and
// do not depend on the world (docs/training.md, "Data"), so fewer ranks compute the same steps as long as
// each rank can hold its share of a micro-step. When it cannot, the launcher keeps the step and cuts it into
// more micro-steps: --grad-accum up, --batch down by the same factor.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <zshard/model.h>

#include "runtime/cli/train_options.h"

namespace zshard::elastic {

struct BatchPlan {
  int batch = 0;       // --batch: sequences per micro-step
  int grad_accum = 1;  // --grad-accum
  int64_t rank_bytes = 0;  // the estimator's peak for the largest rank
  bool fits = true;        // false: not even the smallest micro-batch fits the budget
};

// The training command's flags as zshard-train reads them (unknown flags, of a program of one's own, are
// left alone), with the model built from the registry to size the estimates: null when the registry does
// not know --model, and the launcher then keeps the command's batch.
struct TrainingRun {
  TrainOptions options;
  std::unique_ptr<Model> model;
};
TrainingRun read_training_flags(const std::vector<std::string>& command);

// The plan for ranks placed on hosts of `host_slots` ranks each: the command's own --grad-accum when its
// micro-batch fits `budget` (bytes per rank), else the smallest --grad-accum above it that divides the
// step's sequences, leaves at least one sequence per rank and fits. Without a model it is the command's.
BatchPlan plan_batch(const TrainingRun& run, const std::vector<int>& host_slots, int64_t budget);

// The estimator's peak for the largest rank of `run` with `batch` x `grad_accum` on those hosts.
int64_t estimate_rank_bytes(const TrainingRun& run, const std::vector<int>& host_slots, int batch, int grad_accum);

}  // namespace zshard::elastic
