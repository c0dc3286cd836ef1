#include "comm/polling_work.h"

#include <thread>

#include <zshard/error.h>

#include "comm/backend_base.h"
#include "comm/flight_recorder/recorder.h"
#include "kernels/option_names.h"

namespace zshard::comm {

namespace {
PollPolicy& policy() {
  static PollPolicy p;
  return p;
}
}  // namespace

void set_poll_policy(const PollPolicy& p) { policy() = p; }
const PollPolicy& poll_policy() { return policy(); }

bool PollingWork::test() {
  if (done_) return true;
  try {
    done_ = poll();
  } catch (...) {
    record_end(trace_, trace::State::failed);
    throw;
  }
  if (done_) record_end(trace_, trace::State::completed);
  return done_;
}

void PollingWork::wait(Clock::time_point deadline) {
  const auto begin = Clock::now();
  // Counted on every exit, the throwing ones included.
  struct Timer {
    CommStats* stats;
    Clock::time_point begin;
    ~Timer() {
      if (stats) stats->seconds_waiting += seconds(Clock::now() - begin);
    }
  } timer{stats_, begin};

  const PollPolicy& p = policy();
  if (!done_) record_waiting(trace_);
  while (!test()) {
    const auto now = Clock::now();
    if (now >= deadline) {
      abandoned_ = true;
      record_end(trace_, trace::State::timed_out);
      mark_collectives_failed();
      fail(what_.empty() ? "collective" : what_, ": timed out, not complete after waiting ",
           seconds(now - begin), " s (issued ", seconds(now - started_),
           " s ago); a rank of the group failed or did not issue the same collective (",
           option_name(Option::comm_timeout), " sets the waits)");
    }
    // See PollPolicy. Measured on a 2-core machine (benchmarks/RESULTS.md): yielding from the first poll
    // made small all-reduces 20x slower than MPI_Wait under load; sleeping from the start stalls large
    // transfers, as every MPI round then waits for a sleep to end.
    const auto waited = now - begin;
    if (waited < p.hot) continue;
    if (p.backoff && waited >= p.backoff_after) std::this_thread::sleep_for(p.sleep);
    else std::this_thread::yield();
  }
}

}  // namespace zshard::comm
