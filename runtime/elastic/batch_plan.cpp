#include "runtime/elastic/batch_plan.h"

#include <numeric>

#include <CLI/CLI.hpp>

#include <zshard/model_registry.h>

#include "runtime/planning/memory_check.h"
#include "runtime/tools/cli_options.h"

namespace zshard::elastic {

namespace {

// Hybrid's default and `node` groups are each host's ranks (resolve_node_groups does the same at the
// job's set-up, from where MPI placed the ranks).
StrategyOptions groups_on_hosts(StrategyOptions s, const std::vector<int>& host_slots) {
  if (s.kind != StrategyKind::hybrid || s.shard_group > 0 || !s.shard_group_sizes.empty()) return s;
  const bool equal = std::adjacent_find(host_slots.begin(), host_slots.end(), std::not_equal_to<>()) ==
                     host_slots.end();
  if (host_slots.size() < 2 || (s.shard_group == 0 && equal && host_slots[0] == 1)) {
    s.shard_group = 0;
  } else if (equal) {
    s.shard_group = host_slots[0];
  } else {
    s.shard_group = 0;
    s.shard_group_sizes = host_slots;
  }
  return s;
}

}  // namespace

TrainingRun read_training_flags(const std::vector<std::string>& command) {
  TrainingRun run;
  std::string strategy = "ddp";
  CLI::App app;
  app.allow_extras();
  add_train_flags(app, run.options, strategy);
  std::vector<std::string> args(command.rbegin(), command.rend() - 1);  // CLI11 takes them reversed
  try {
    app.parse(args);
  } catch (const CLI::Error& e) {
    throw UsageError("the training command: " + cli_error_line(e));
  }
  run.kind = parse_strategy(strategy);
  run.options.strategy.kind = run.kind;
  const std::vector<std::string> known = model_names();
  if (std::find(known.begin(), known.end(), run.options.model) != known.end()) {
    run.model = build_model(run.options.model, resolve_model_config(run.options));
    run.model->set_activation_checkpointing(run.options.activation_checkpointing);
  }
  return run;
}

int64_t estimate_rank_bytes(const TrainingRun& run, const std::vector<int>& host_slots, int batch, int grad_accum) {
  if (!run.model) return 0;
  const int world = std::accumulate(host_slots.begin(), host_slots.end(), 0);
  TrainOptions o = run.options;
  o.strategy = groups_on_hosts(o.strategy, host_slots);
  o.grad_accum = grad_accum;
  EstimateInput in = estimate_input(o, *run.model, world, run.kind, (batch + world - 1) / world);
  in.group = -1;  // unequal groups: the smallest, whose ranks hold the largest shards
  return estimate_memory(in).total();
}

BatchPlan plan_batch(const TrainingRun& run, const std::vector<int>& host_slots, int64_t budget) {
  const TrainOptions& o = run.options;
  const int world = std::accumulate(host_slots.begin(), host_slots.end(), 0);
  BatchPlan plan{o.batch, o.grad_accum, estimate_rank_bytes(run, host_slots, o.batch, o.grad_accum), true};
  if (!run.model || plan.rank_bytes <= budget) return plan;
  const int64_t sequences = int64_t(o.batch) * o.grad_accum;
  for (int64_t accum = o.grad_accum + 1; sequences / accum >= world; ++accum) {
    if (sequences % accum != 0) continue;
    const int batch = int(sequences / accum);
    plan = {batch, int(accum), estimate_rank_bytes(run, host_slots, batch, int(accum)), true};
    if (plan.rank_bytes <= budget) return plan;
  }
  plan.fits = false;  // the smallest micro-batch tried; the job's own memory check has the last word
  return plan;
}

}  // namespace zshard::elastic
