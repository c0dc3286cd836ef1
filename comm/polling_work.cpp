#include "comm/polling_work.h"

#include <thread>

#include "kernels/error.h"

namespace zshard::comm {

namespace {
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

bool PollingWork::test() {
  if (!done_) done_ = poll();
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

  while (!test()) {
    const auto now = Clock::now();
    if (now >= deadline) {
      abandoned_ = true;
      fail(what_.empty() ? "collective" : what_, ": timed out, not complete after waiting ",
           seconds(now - begin), " s (issued ", seconds(now - started_),
           " s ago); a rank of the group failed or did not issue the same collective");
    }
    // Poll hot, as MPI_Wait does: non-blocking MPI collectives advance only inside MPI calls, so a sleep
    // between polls stalls large transfers (several times slower). Yielding leaves the core to peers
    // when ranks outnumber cores.
    std::this_thread::yield();
  }
}

}  // namespace zshard::comm
