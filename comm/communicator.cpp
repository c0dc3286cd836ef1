#include <zshard/communicator.h>

#include <numeric>

#include <zshard/error.h>

namespace zshard::comm {

std::string_view collective_name(Collective c) {
  switch (c) {
    case Collective::all_gather: return "all_gather";
    case Collective::reduce_scatter: return "reduce_scatter";
    case Collective::all_reduce: return "all_reduce";
    case Collective::broadcast: return "broadcast";
    case Collective::all_to_all: return "all_to_all";
  }
  return "?";
}

void Work::wait() {
  // Saturate, so that a huge timeout means "no deadline" rather than an overflowed time point.
  const auto now = Clock::now();
  wait(timeout_ >= Clock::time_point::max() - now ? Clock::time_point::max() : now + timeout_);
}

void Work::set_default_deadline(Clock::duration timeout, std::string what) {
  timeout_ = timeout;
  what_ = std::move(what);
}

int64_t CommStats::total_bytes() const { return std::accumulate(bytes.begin(), bytes.end(), int64_t{0}); }

int64_t bus_bytes(Collective c, int group_size, int64_t buffer_bytes) {
  const int64_t n = group_size;
  if (n <= 1) return 0;
  switch (c) {
    case Collective::all_gather:
    case Collective::reduce_scatter:
    case Collective::all_to_all: return buffer_bytes * (n - 1) / n;
    case Collective::all_reduce: return 2 * buffer_bytes * (n - 1) / n;
    case Collective::broadcast: return buffer_bytes;
  }
  return 0;
}

void all_reduce_sum(Communicator& comm, double* values, size_t count) {
  comm.all_reduce(values, count, DType::f64, ReduceOp::sum)->wait();
}

}  // namespace zshard::comm
