#include "runtime/elastic/batch_plan.h"

#include <numeric>

#include <CLI/CLI.hpp>

#include <zshard/model_registry.h>

#include "shard/memory/fit_check.h"
#include "runtime/cli/flags.h"
#include "shard/plan_internals.h"

namespace zshard::elastic {

TrainingRun read_training_flags(const std::vector<std::string>& command) {
  TrainingRun run;
  CLI::App app;
  app.allow_extras();
  add_train_flags(app, run.options);
  refuse_empty_values(app);
  std::vector<std::string> args(command.rbegin(), command.rend() - 1);  // CLI11 takes them reversed
  try {
    app.parse(args);
  } catch (const CLI::Error& e) {
    throw UsageError("the training command: " + cli_error_line(e, app));
  }
  const std::vector<std::string> known = model_names();
  const ModelOptions& model = run.options.model;
  if (std::find(known.begin(), known.end(), model.name) != known.end()) {
    run.model = build_model(model.name, resolve_model_config(model));
    try {
      configure_model(*run.model, model, run.options.plan.placement);
    } catch (const UsageError&) {
      // --attention fused that this host cannot run (no cuDNN here): the job's hosts decide. The
      // probabilities kept, the plan is on the safe side.
      run.model->set_attention(AttentionKernel::blocks);
    }
  }
  return run;
}

int64_t estimate_rank_bytes(const TrainingRun& run, const std::vector<int>& host_slots, int batch, int grad_accum) {
  // The groups on these hosts, for every model: a --shard-group the hosts cannot hold is refused here.
  const ShardPlan plan = plan_on_hosts(run.options.plan, host_slots);
  if (!run.model) return 0;
  const int world = std::accumulate(host_slots.begin(), host_slots.end(), 0);
  // The job's own set-up check counts an asynchronous save's snapshot: so does the plan.
  BatchShape shape = batch_shape(run.options);
  shape.batch = batch;
  shape.grad_accum = grad_accum;
  shape.even = true;  // zshard-run refuses --rank-batches N,...
  EstimateInput in = estimate_input(plan, *run.model, shape, (batch + world - 1) / world);
  in.group = -1;  // unequal groups: the rank that needs the most
  return estimate_memory(in).total();
}

BatchPlan plan_batch(const TrainingRun& run, const std::vector<int>& host_slots, int64_t budget) {
  const DataOptions& o = run.options.data;
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
