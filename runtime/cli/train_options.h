// zshard-train's options, in typed parts, each beside its flags and its checks (this folder):
//   model      what is trained and how it starts               model_options.h
//   data       what each step reads, the batch and its split   data_options.h
//   eval       the held-out evaluation                         data_options.h
//   optimizer  AdamW and the learning-rate schedule            optimizer_options.h
//   plan       the sharding plan: strategy, groups, device     <zshard/plan.h>, plan_flags.h
//   output     progress, JSON log, final weights, memory report  output_options.h
//   saves      checkpoints and resume                          output_options.h
#pragma once
#include <string>
#include <vector>

#include <zshard/plan.h>

#include "kernels/io/atomic_file.h"
#include "runtime/cli/path_checks.h"
#include "runtime/cli/cli_fwd.h"
#include "runtime/cli/data_options.h"
#include "runtime/cli/model_options.h"
#include "runtime/cli/optimizer_options.h"
#include "runtime/cli/output_options.h"
#include "shard/memory/fit_check.h"

namespace zshard {

struct TrainOptions {
  ModelOptions model;
  DataOptions data;
  EvalOptions eval;
  OptimizerOptions optimizer;
  PlanOptions plan;
  OutputOptions output;
  SaveOptions saves;
};

// Every flag of zshard-train, bound to `options`.
void add_train_flags(CLI::App& app, TrainOptions& options);

// Checks every option that needs neither the data nor the model, on `world_size` ranks: each part, then
// what ties parts together. Throws UsageError naming the flag.
void validate_options(const TrainOptions& options, int world_size);

// The run's batch as the memory check sizes it (its plan's estimate, --batch auto, zshard-run's plan).
BatchShape batch_shape(const TrainOptions& options);

// The files rank 0 writes when the run ends: writable now, and none of them an input or another output.
// Checkpoints go into --save-dir: never into a checkpoint the run resumes from. Throws UsageError.
void check_outputs(const TrainOptions& options);

// The files the options name, inputs then outputs, each with its flag (empty where not given): what
// another output (zshard-train's --step-log) must not be.
std::vector<FlagPath> named_files(const TrainOptions& options);
// The flight recorder's directory is made at set-up: a file of its very name (not one beside its traces)
// would fail only after training. UsageError naming `file`'s flag.
void check_not_trace_dir(const FlagPath& file, const std::string& trace_dir);

}  // namespace zshard
