// A Work completed by polling. wait() calls test() with short pauses in between rather than blocking in the
// library (MPI_Wait, a stream synchronise), so that it can give up at a deadline instead of hanging and can
// measure the time the caller was blocked. Backends implement poll().
#pragma once
#include "comm/communicator.h"

namespace zshard::comm {

class PollingWork : public Work {
 public:
  // `stats` belongs to the issuing communicator and receives the seconds blocked in wait(); may be null.
  explicit PollingWork(CommStats* stats) : stats_(stats) {}

  bool test() final;
  // Throws zshard::Error (naming what set_default_deadline described) once `deadline` passes; the
  // operation stays in flight, and a later wait() or test() may still complete it.
  void wait(Clock::time_point deadline) final;
  using Work::wait;

 protected:
  // Advances the operation without blocking; true once it is complete. Not called again after that.
  virtual bool poll() = 0;
  // True when a wait() gave up at its deadline and the operation has not completed since.
  bool abandoned() const { return abandoned_ && !done_; }
  bool done() const { return done_; }

 private:
  CommStats* stats_;
  Clock::time_point started_ = Clock::now();
  bool done_ = false;
  bool abandoned_ = false;
};

}  // namespace zshard::comm
