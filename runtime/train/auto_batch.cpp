#include "runtime/train/auto_batch.h"

#include <algorithm>
#include <ostream>
#include <vector>

#include "comm/agreed_failure.h"
#include "comm/launch.h"
#include "kernels/allocator.h"
#include "runtime/cli/memory_flags.h"
#include "shard/memory/fit_check.h"
#include "shard/memory/estimator.h"

namespace zshard {

namespace {

// Every rank's `value`, the largest of them (one all-reduce).
double max_over_ranks(comm::Communicator& world, double value) {
  std::vector<double> values(size_t(world.size()), 0.0);
  values[size_t(world.rank())] = value;
  comm::all_reduce_sum(world, values.data(), values.size());
  return *std::max_element(values.begin(), values.end());
}

// --mem-budget, else the memory check's usable memory, the least over the ranks so that all agree. Its
// source names it in the messages: "--mem-budget 2.15 GB", or where the usable memory came from.
MemoryBudget agreed_budget(const TrainOptions& o, comm::Communicator& world) {
  if (!o.data.mem_budget.empty()) {
    const int64_t bytes = parse_bytes(o.data.mem_budget, "--mem-budget");
    return {bytes, "--mem-budget " + format_bytes(double(bytes))};
  }
  const MemoryBudget usable = usable_memory(o.plan.placement.device, comm::ranks_on_this_host());
  const double unknown = max_over_ranks(world, usable.bytes < 0 ? 1 : 0);
  if (unknown > 0)
    throw AgreedFailure("--batch auto: the memory a rank can use is unknown here; give --mem-budget SIZE", 2,
                        world.rank() == 0);
  const int64_t least = -int64_t(max_over_ranks(world, -double(usable.bytes)));
  return {least, "the usable " + format_bytes(double(least)) + " per rank (" + usable.source +
                     "; --mem-budget sets another)"};
}

}  // namespace

std::unique_ptr<Trainer> fit_batch_to_budget(TrainOptions& options, comm::Communicator& world, std::ostream* out) {
  const int ranks = world.size();
  const bool report = out && world.rank() == 0;
  DataOptions& data = options.data;
  ShardPlan plan;
  run_agreed(world, [&] {
    plan = resolve_plan(options.plan, world);  // sets the timeout, then its collectives: the first of the run
    data.batch = ranks;  // the smallest batch auto can choose, for the checks of --batch
    validate_options(options, ranks);
  });
  const MemoryBudget budget = agreed_budget(options, world);
  int rank_batch = 0;
  run_agreed(world, [&] {
    const std::unique_ptr<Model> model = build_model(options.model.name, resolve_model_config(options.model));
    configure_model(*model, options.model, plan.placement);
    BatchShape shape = batch_shape(options);
    shape.even = true;  // --batch auto splits evenly
    rank_batch = largest_rank_batch_fitting(plan, *model, shape, budget);
    if (rank_batch == 0) {
      const EstimateInput one = estimate_input(plan, *model, shape, 1);
      throw UsageError(detail::concat("--batch auto: one sequence per rank needs about ",
                                      format_bytes(double(estimate_memory(one).total())), " by the estimate, more than ",
                                      budget.source));
    }
  });
  if (report)
    *out << "zshard-train: --batch auto: the estimate fits " << rank_batch << " sequence(s) per rank in "
         << budget.source << "\n";
  const Device device = plan.placement.device;
  const int64_t tokens = default_auto_batch_tokens(device);
  if (data.mem_budget.empty() && rank_batch > std::max<int64_t>(1, tokens / data.seq)) {
    rank_batch = int(std::max<int64_t>(1, tokens / data.seq));
    if (report)
      *out << "zshard-train: --batch auto: without --mem-budget, at most " << tokens << " tokens per rank: "
           << rank_batch << " sequence(s) of " << data.seq << "\n";
  }
  // zero3 and hybrid prefetch from the second micro-step on (the first records the gather order), one
  // more gathered unit alive: the check measures through it, so that it sees the steps that follow;
  // not past a checkpoint, though (--save-every 1 saves step 1, which only the caller can).
  const bool prefetch_unseen = plan.params_sharded() && data.grad_accum == 1;
  const int measured_steps = std::min(options.optimizer.steps, prefetch_unseen && options.saves.save_every != 1 ? 2 : 1);
  const std::string measured = measured_steps == 1 ? "the first step's" : "the first 2 steps'";
  for (;;) {
    data.batch = ranks * rank_batch;
    Allocator::of(device).reset_peaks();  // the previous attempt's buffers are gone: measure this one alone
    auto trainer = std::make_unique<Trainer>(options, world);
    if (options.optimizer.steps == 0) return trainer;  // no step to measure: the estimate's batch
    for (int s = 0; s < measured_steps; ++s) trainer->run_step(out);
    const double peak = max_over_ranks(world, double(Allocator::of(device).stats().peak_total));
    if (peak <= double(budget.bytes)) {
      if (report)
        *out << "zshard-train: --batch auto: batch " << data.batch << " (" << rank_batch
             << " per rank); " << measured << " measured peak " << format_bytes(peak) << " fits " << budget.source
             << "\n";
      return trainer;
    }
    const std::string over = detail::concat(measured, " measured peak ", format_bytes(peak), " at batch ",
                                            data.batch, " exceeds ", budget.source);
    if (--rank_batch == 0)
      throw AgreedFailure("--batch auto: " + over + ", with one sequence per rank", 2, world.rank() == 0);
    if (report) *out << "zshard-train: --batch auto: " << over << "; trying batch " << ranks * rank_batch << "\n";
  }
}

}  // namespace zshard
