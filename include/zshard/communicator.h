// Communicator: collectives over a group of ranks, in the spirit of PyTorch c10d. Every collective is
// asynchronous and returns a Work handle; the blocking forms are `->wait()` on it. Backends: self (one
// rank, no MPI), mpi (host buffers; non-blocking MPI collectives, and rings of its own for reductions), and
// on GPUs nccl.
#pragma once
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <zshard/dtype.h>

namespace zshard {

// --comm: mpi carries host or device buffers (device ones staged through the host unless MPI is
// CUDA-aware); nccl carries device buffers between GPUs, one GPU per rank.
enum class CommBackend { mpi, nccl };

}  // namespace zshard

namespace zshard::comm {

enum class ReduceOp { sum, avg };
enum class Collective { all_gather, reduce_scatter, all_reduce, broadcast, all_to_all };
constexpr int kNumCollectives = 5;

std::string_view collective_name(Collective c);

using Clock = std::chrono::steady_clock;

// Handle of an operation in flight. The buffers it was given must stay alive until wait() returns or
// test() returns true; the Work must not outlive its communicator.
class Work {
 public:
  virtual ~Work() = default;
  // True once the operation is complete (and its buffers may be reused). Never blocks.
  virtual bool test() = 0;
  // Blocks until done. Throws zshard::Error naming the collective if `deadline` passes first.
  virtual void wait(Clock::time_point deadline) = 0;
  // Blocks until done or the communicator's timeout expires.
  void wait();

  void set_default_deadline(Clock::duration timeout, std::string what);

 protected:
  Clock::duration timeout_ = std::chrono::minutes(5);
  std::string what_;
};
using WorkPtr = std::unique_ptr<Work>;

// Bytes each rank moved, counted with the nccl-tests bus-bandwidth convention: all_gather, reduce_scatter
// and all_to_all move (n-1)/n of the full buffer, all_reduce 2(n-1)/n, broadcast the buffer.
struct CommStats {
  std::array<int64_t, kNumCollectives> bytes{};
  std::array<int64_t, kNumCollectives> calls{};
  double seconds_waiting = 0;  // exposed communication: host blocked in wait(), or (nccl) compute stalled
  int64_t total_bytes() const;
};

// The bus bytes of one collective in a group of `group_size` ranks, in integers (floor). `buffer_bytes` is
// the full buffer: size()*count elements for all_gather, reduce_scatter and all_to_all, count for the
// others. A group of one moves nothing, so every collective, broadcast included, counts 0 there.
int64_t bus_bytes(Collective c, int group_size, int64_t buffer_bytes);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;
  // Device whose buffers the collectives take (host for self/mpi, the rank's GPU for nccl).
  virtual Device device() const { return Device::cpu; }

  // recv holds size()*count elements; rank r's `count` elements land at recv + r*count.
  // send may equal recv + rank()*count (in place).
  virtual WorkPtr all_gather(const void* send, void* recv, size_t count, DType dtype) = 0;
  // send holds size()*count elements; rank r receives the reduction of block r in recv (count).
  virtual WorkPtr reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) = 0;
  // reduce_scatter for a caller done with `send`, which may be overwritten with partial sums (the mpi
  // backend sums in it and so allocates nothing); send and recv are distinct. Others ignore the licence.
  virtual WorkPtr reduce_scatter_consuming(void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
    return reduce_scatter(send, recv, count, dtype, op);
  }
  // In place.
  virtual WorkPtr all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) = 0;
  virtual WorkPtr broadcast(void* buf, size_t count, DType dtype, int root) = 0;
  // send and recv hold size()*count elements each: block r of send goes to rank r, and rank r's block for
  // this rank lands at recv + r*count. Typeless (a move): every dtype travels. Not in place.
  virtual WorkPtr all_to_all(const void* send, void* recv, size_t count, DType dtype) = 0;
  virtual void barrier() = 0;

  // Splits into sub-groups: ranks passing the same color form a group, ordered by key (c10d new_group,
  // MPI_Comm_split). Collective over this communicator.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // Deadline given to every Work this communicator creates from now on.
  void set_timeout(Clock::duration timeout) { timeout_ = timeout; }
  Clock::duration timeout() const { return timeout_; }

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }
  // Adds to stats() what the device measured and has finished since (nccl: the compute stream's time
  // stalled on collectives); host backends count as they go and have nothing to add. Never blocks.
  virtual void collect_device_stats() {}

 protected:
  void count(Collective c, int64_t bytes) {
    stats_.bytes[int(c)] += bytes;
    stats_.calls[int(c)] += 1;
  }
  Clock::duration timeout_ = std::chrono::minutes(5);
  CommStats stats_;
};

// Blocking conveniences.
void all_reduce_sum(Communicator& comm, double* values, size_t count);

}  // namespace zshard::comm
