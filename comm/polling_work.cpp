#include "comm/polling_work.h"

#include <algorithm>
#include <thread>

#include "kernels/error.h"

namespace zshard::comm {

namespace {
// A few yields catch short operations with little latency; then sleeps that back off, so that waiting
// ranks leave the cores to their peers when ranks outnumber cores.
constexpr int kSpinPolls = 64;
constexpr Clock::duration kFirstSleep = std::chrono::microseconds(10);
constexpr Clock::duration kMaxSleep = std::chrono::microseconds(500);

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

  auto pause = kFirstSleep;
  for (int polls = 0; !test(); ++polls) {
    const auto now = Clock::now();
    if (now >= deadline) {
      abandoned_ = true;
      fail(what_.empty() ? "collective" : what_, ": timed out, not complete after waiting ",
           seconds(now - begin), " s (issued ", seconds(now - started_),
           " s ago); a rank of the group failed or did not issue the same collective");
    }
    if (polls < kSpinPolls) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::min(pause, deadline - now));
      pause = std::min(2 * pause, kMaxSleep);
    }
  }
}

}  // namespace zshard::comm
