// --check-collectives: at every step boundary the ranks compare what each issued on every recorded group
// since the last boundary (a hash of the signatures op, count, dtype, reduction, root and the engine's
// label), in the spirit of torch's collective fingerprinting under TORCH_DISTRIBUTED_DEBUG=DETAIL. Where a
// group's members differ, they exchange the signatures the flight recorder still holds and the job stops
// naming the first collective at which they part, and both sides.
//
// A divergence usually hangs or breaks a collective before the step ends (a rank that skips a gather
// leaves its peers waiting). When a step fails in this mode, each rank therefore joins the comparison
// while its stack unwinds, before the job is aborted, waiting up to its --comm-timeout for the others:
// the ranks at the boundary wait there up to twice that, so the ones stuck in a collective reach them
// once their deadline passes. A failure then takes up to one --comm-timeout longer to end the job. The
// comparison runs on a communicator of its own, split from the world at set-up: it never shares a queue
// with the collectives it judges. A divergence that crashes the MPI library (collectives of different
// sizes are undefined behaviour there) is left to the flight recorder's dump of the fatal signal.
#pragma once
#include <memory>
#include <string>

#include <zshard/communicator.h>

namespace zshard::comm {

class CollectiveCheck {
 public:
  // Collective over `world` (a host communicator, recorded: start_recording has run on it).
  explicit CollectiveCheck(Communicator& world);
  // Destroyed while an exception unwinds (a failed step), it runs the comparison after a failure: where
  // it finds a divergence, rank 0 prints it and every rank ends the job (abort_world) without its own
  // failure's line, a consequence of the divergence. Where a rank failed with none of its collectives
  // failed (an error of its own), that error is the cause: its line ends the job, and the ranks that timed
  // out waiting for it say nothing.
  ~CollectiveCheck();
  CollectiveCheck(const CollectiveCheck&) = delete;
  CollectiveCheck& operator=(const CollectiveCheck&) = delete;

  // After step `step`, on every rank: throws AgreedFailure (exit 1, reported by rank 0) naming the
  // first divergence, if any. Collective over the world.
  void compare(int step);

 private:
  struct Comparison {
    std::string divergence;    // the line naming it, or empty
    bool own_failure = false;  // some rank failed on its own: the comparison stopped there
  };
  // The comparison (`failed`: from a failed step; `own_failure`: this rank's error of its own).
  Comparison exchange(bool failed, bool own_failure, Clock::time_point deadline);

  Communicator& world_;
  std::unique_ptr<Communicator> comm_;
  int steps_compared_ = 0;
  // False once a comparison gave up or found a divergence: the communicator may hold its collective, or
  // there is nothing left to say.
  bool usable_ = true;
};

}  // namespace zshard::comm
