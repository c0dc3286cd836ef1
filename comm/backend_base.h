// What zshard's own backends (self, mpi, nccl) share beyond the public Communicator interface: their
// group in the flight recorder (comm/flight_recorder/recorder.h), so that each collective they issue is
// recorded under it. A Communicator of a user's own is simply not recorded.
#pragma once
#include <zshard/communicator.h>

namespace zshard::comm {

class Backend : public Communicator {
 public:
  // This communicator's group in the flight recorder; -1: not recorded.
  int trace_group() const { return trace_group_; }
  void set_trace_group(int group) { trace_group_ = group; }

 protected:
  int trace_group_ = -1;
};

// `comm`'s group in the flight recorder: -1 for a communicator that is not one of zshard's backends, or
// is not recorded.
inline int trace_group_of(const Communicator& comm) {
  const auto* backend = dynamic_cast<const Backend*>(&comm);
  return backend ? backend->trace_group() : -1;
}

// Once any collective of this process has timed out or failed, its peers may never match the ones still
// in flight: nothing may wait on them again (a second wait would add a second deadline to the first and
// lose its message). Set by the backends; teardown checks it and aborts instead of waiting.
void mark_collectives_failed();
bool collectives_failed();

// A wait's length as the stats and deadline messages give it.
inline double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace zshard::comm
