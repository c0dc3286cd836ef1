// zshard-train: trains a model of the registry with the chosen strategy. Run it plainly for one process,
// or under mpirun / srun for several ranks.
#include <iostream>

#include "comm/agreed_failure.h"
#include "kernels/io/atomic_file.h"
#include "runtime/tools/tool_runner.h"
#include "runtime/tools/tools.h"
#include "runtime/train/auto_batch.h"
#include "runtime/cli/train_options.h"
#include "runtime/train/save_policy.h"
#include "runtime/train/step_log.h"
#include "runtime/train/trainer.h"
#include "runtime/train/weights_export.h"
#include "shard/engine_internals.h"
#include "shard/plan_internals.h"

namespace zshard {

int train_tool(int argc, char** argv, const std::string& default_model) {
  TrainOptions options;
  options.model.name = default_model;
  CLI::App app{"zshard-train: sharded data-parallel training of a model of the registry (--model)"};
  add_train_flags(app, options);
  std::string step_log_path;
  app.add_option("--step-log", step_log_path,
                 "append each step's --log-json record to this file as soon as the step ends (what zshard-run "
                 "reads; kept when the run is killed)");
  return run_tool("zshard-train", argc, argv, app, [&](comm::Communicator& world) {
    const int rank = world.rank();
    // The step log's checks first, with the other outputs' and before anything is allocated (or, under
    // --batch auto, trained): a refused --step-log leaves no --save-dir made by SavePolicy behind either.
    // Its agreement is the run's first collective: under --comm-timeout, as the plan's are.
    apply_comm_timeout(options.plan, world);
    StepLog step_log(step_log_path, world, named_files(options));
    const std::unique_ptr<Trainer> fitted = options.data.auto_batch ? fit_batch_to_budget(options, world, &std::cout)
                                                                    : std::make_unique<Trainer>(options, world);
    Trainer& trainer = *fitted;
    const ShardPlan& plan = trainer.plan();
    const DataOptions& data = options.data;
    // Hybrid's groups, which the hosts may have chosen; groups of one (the default on a prime world on one
    // host) shard nothing and cost gathers beside, which no user would pick knowingly.
    std::string strategy(strategy_name(plan.kind));
    if (plan.kind == StrategyKind::hybrid) {
      const bool ones = plan.groups.count() == world.size(), defaulted = plan.shard_group.automatic() && world.size() > 1;
      strategy += " (shard groups " + std::string(plan.groups.equal() ? "of " : "") + plan.groups.describe() +
                  (ones ? ": every rank holds the whole model, run as ddp" : "") +
                  (ones && defaulted ? ", the default where no larger size makes two groups or more; --shard-group sets them" : "") + ")";
    }
    if (rank == 0)
      std::cout << "zshard-train: " << strategy << " on " << world.size() << " rank(s), "
                << device_name(plan.placement.device) << " (" << dtype_flag(plan.placement.param_dtype) << " params, "
                << dtype_flag(plan.placement.reduce_dtype) << " reduce, "
                << EngineInternals::collective_world(trainer.engine()).backend() << "), " << options.model.name << ", "
                << num_params(trainer.model()) << " parameters, batch " << data.batch << "x" << data.seq
                << (data.grad_accum > 1 ? " x" + std::to_string(data.grad_accum) : "") << ", "
                << options.optimizer.steps << " steps\n";
    SavePolicy saves(trainer, &std::cout);
    install_stop_handlers();
    // --batch auto took its first steps to measure their peak, stopping short of any save point but
    // its last: that step is checkpointed like any other.
    step_log.catch_up(trainer.history());
    try {
      if (trainer.steps_done() == 0 || saves.after_step())
        trainer.run(&std::cout, [&] {
          // Logged between the boundary's agreement and its save: a save in flight commits before the line
          // of the step after it, a sync save after its own step's line, so that zshard-run's merged log
          // never misses a step behind the checkpoint it resumes from.
          const bool go_on = saves.agree_at_boundary();
          step_log.catch_up(trainer.history());
          saves.save_if_due();
          return go_on;
        });
    } catch (const AgreedFailure&) {
      // Every rank stops here alike (a non-finite step): the save in flight, of a good step, still commits.
      try {
        saves.finish_in_flight();
      } catch (const AgreedFailure&) {  // the first failure is the one reported
      }
      throw;
    }
    saves.save();  // the final save (also after a stop signal)
    if (!options.output.save.empty()) save_weights(trainer.engine(), trainer.model(), world, options.output.save);
    MemoryReport report = trainer.engine().memory_report();
    report.predicted_checkpoint_snapshot = saves.predicted_snapshot_bytes();
    if (rank == 0) report.print(std::cout);
    if (!options.output.mem_report.empty())
      run_agreed(world, [&] {
        if (rank == 0) write_file_atomically(options.output.mem_report, report.to_json(2) + "\n");
      });
  });
}

}  // namespace zshard
