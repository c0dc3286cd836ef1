// zshard-train: trains a model of the registry with the chosen strategy. Run it plainly for one process,
// or under mpirun / srun for several ranks.
#include <iostream>

#include <nlohmann/json.hpp>

#include "comm/agreed_failure.h"
#include "kernels/io/atomic_file.h"
#include "runtime/planning/memory_report.h"
#include "runtime/tools/cli_options.h"
#include "runtime/tools/tool_runner.h"
#include "runtime/tools/tools.h"
#include "runtime/train/auto_batch.h"
#include "runtime/train/save_policy.h"
#include "runtime/train/trainer.h"

namespace zshard {

int train_tool(int argc, char** argv, const std::string& default_model) {
  TrainOptions options;
  options.model = default_model;
  std::string strategy = "ddp";
  CLI::App app{"zshard-train: sharded data-parallel training of a transformer"};
  add_train_flags(app, options, strategy);
  return run_tool("zshard-train", argc, argv, app, [&](comm::Communicator& world) {
    const int rank = world.rank();
    run_agreed(world, [&] { options.strategy.kind = parse_strategy(strategy); });
    const std::unique_ptr<Trainer> fitted = options.auto_batch ? fit_batch_to_budget(options, world, &std::cout)
                                                               : std::make_unique<Trainer>(options, world);
    Trainer& trainer = *fitted;
    if (rank == 0)
      std::cout << "zshard-train: " << strategy << " on " << world.size() << " rank(s), "
                << device_name(options.placement.device) << " (" << dtype_flag(options.placement.param_dtype)
                << " params, " << dtype_flag(options.placement.reduce_dtype) << " reduce, "
                << trainer.collective_world().backend() << "), "
                << options.model << ", " << num_params(trainer.model()) << " parameters, batch " << options.batch << "x"
                << options.seq << (options.grad_accum > 1 ? " x" + std::to_string(options.grad_accum) : "")
                << ", " << options.steps << " steps\n";
    Checkpointer checkpoints(trainer, &std::cout);
    install_stop_handlers();
    // --batch auto took its first steps to measure their peak, stopping short of any save point but
    // its last: that step is checkpointed like any other.
    if (trainer.steps_done() == 0 || checkpoints.after_step())
      trainer.run(&std::cout, [&] { return checkpoints.after_step(); });
    checkpoints.save();  // the final save (also after a stop signal)
    if (!options.save.empty()) trainer.save_weights(options.save);
    const MemoryReport report = MemoryReport::collect(trainer);
    if (rank == 0) report.print(std::cout);
    if (!options.mem_report.empty())
      run_agreed(world, [&] {
        if (rank == 0) write_file_atomically(options.mem_report, report.to_json().dump(2) + "\n");
      });
  });
}

}  // namespace zshard
