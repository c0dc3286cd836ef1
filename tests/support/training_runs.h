// Running short training jobs in-process, for the parity tests: the same options on a world of one
// (the reference) and on the MPI world under any strategy.
#pragma once
#include <string>
#include <vector>

#include <zshard/communicator.h>

#include "runtime/train/trainer.h"

namespace zshard::test {

struct RunResult {
  std::vector<double> losses;       // per optimizer step, global mean
  std::vector<double> grad_norms;
  std::vector<float> params;        // every unit's full flat parameters, concatenated
  std::vector<std::vector<int>> rank_batches;  // per optimizer step, the split it ran with
  std::vector<int64_t> comm_bytes;  // per optimizer step, this rank's
  std::vector<double> eval_losses;  // of the steps that evaluated (--eval-every), in order
};

// The tiny model on the embedded default data with clipping on; tests change what they compare.
TrainOptions tiny_options(int steps);
RunResult train(const TrainOptions& options, comm::Communicator& comm);
// The single-process reference run of the same options.
RunResult train_single_process(const TrainOptions& options);

// Every strategy a world of `world` ranks can run, the corner cases included: ddp, zero1/2/3, zero3 keeping
// gathered parameters until backward, hybrid with every group size that divides the world, and at 3 and 4
// ranks hybrid with groups of unequal sizes.
std::vector<StrategyOptions> strategies_for(int world);
// "zero3 no-reshard", "hybrid G=2", "hybrid G=1,2,1"...
std::string describe(const StrategyOptions& s);

}  // namespace zshard::test
