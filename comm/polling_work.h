// A Work completed by polling. wait() calls test() with short pauses in between rather than blocking in the
// library (MPI_Wait, a stream synchronise), so that it can give up at a deadline instead of hanging and can
// measure the time the caller was blocked. Backends implement poll().
#pragma once
#include <zshard/communicator.h>

namespace zshard::comm {

// How wait() spaces its polls. For the first `hot` of a wait it polls back to back, as MPI_Wait does:
// short collectives finish there (non-blocking MPI collectives advance only inside MPI calls, one round
// per call). After that it yields the core between polls. With `backoff` on, once a wait has lasted
// `backoff_after` it sleeps `sleep` between polls: on a node whose ranks outnumber its cores a waiting
// rank then leaves the core to a peer that is still computing, and is woken with the scheduler's wake-up
// priority rather than queued behind every runnable task; it costs at most one `sleep` per MPI round.
struct PollPolicy {
  Clock::duration hot = std::chrono::microseconds(50);
  bool backoff = false;
  Clock::duration backoff_after = std::chrono::milliseconds(1);
  Clock::duration sleep = std::chrono::microseconds(50);
};
// Process-wide; init_world turns `backoff` on when this node's ranks outnumber its cores (the env
// variable ZSHARD_POLL_BACKOFF=0 or 1 forces it off or on). Set it before issuing collectives.
void set_poll_policy(const PollPolicy& policy);
const PollPolicy& poll_policy();

class PollingWork : public Work {
 public:
  // `stats` belongs to the issuing communicator and receives the seconds blocked in wait(); may be null.
  explicit PollingWork(CommStats* stats) : stats_(stats) {}

  bool test() final;
  // Throws zshard::Error (naming what set_default_deadline described) once `deadline` passes; the
  // operation stays in flight, and a later wait() or test() may still complete it.
  void wait(Clock::time_point deadline) final;
  using Work::wait;
  // The flight recorder's id of the collective (comm/flight_recorder/recorder.h): told when it ends.
  void set_trace(uint64_t id) { trace_ = id; }

 protected:
  // Advances the operation without blocking; true once it is complete. Not called again after that.
  virtual bool poll() = 0;
  // True when a wait() gave up at its deadline and the operation has not completed since.
  bool abandoned() const { return abandoned_ && !done_; }
  bool done() const { return done_; }

 private:
  CommStats* stats_;
  uint64_t trace_ = 0;
  Clock::time_point started_ = Clock::now();
  bool done_ = false;
  bool abandoned_ = false;
};

}  // namespace zshard::comm
