// The NCCL backend: device buffers, collectives on a dedicated communication stream.
//
// Ordering: each collective first makes the comm stream wait for an event recorded on the compute stream
// (so it sees every kernel that produced its input), then runs, then records a completion event. Work::wait()
// makes the compute stream wait for that event and returns without blocking the host; Work::test() asks the
// event from the host (cudaEventQuery).
//
// Exposed time: wait() brackets the compute stream's wait with two timing events; the time between them
// is how long compute stalled on the collective, read back by collect_device_stats() once both ran.
//
// No hangs: a waited collective is armed with its deadline. The watchdog (check_watchdog) runs on every
// call into this communicator, in test(), and in synchronize(), which blocks the host by polling rather
// than in the driver. On an NCCL asynchronous error, or a collective still running past its deadline, it
// calls ncclCommAbort (so the stuck kernels exit) and throws zshard::Error naming the collective; the
// communicator is unusable afterwards.
#pragma once
#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <string>
#include <vector>

#include <zshard/communicator.h>

#include "comm/backend_base.h"

#include "kernels/allocator.h"

namespace zshard::comm {

// This process's index among the ranks on its node: OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, or, when
// `world` is the mpi backend, its rank in MPI_Comm_split_type(MPI_COMM_TYPE_SHARED); 0 otherwise.
int local_rank(Communicator& world);
// The GPU of this rank: local_rank(world) modulo the visible device count.
int local_device(Communicator& world);

class NcclCommunicator final : public Backend {
 public:
  // Collective over `bootstrap`: rank 0 creates the NCCL unique id and broadcasts it as bytes through
  // `bootstrap`; the new communicator has the same ranks. Selects `device` (cuda_init must have run: its
  // scratch comes from the device allocator).
  // Collectives are ordered after the work on `compute_stream` and wait() orders it after them.
  NcclCommunicator(Communicator& bootstrap, int device, cudaStream_t compute_stream = nullptr);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  Device device() const override { return Device::cuda; }

  // In place when send == recv + rank()*count.
  WorkPtr all_gather(const void* send, void* recv, size_t count, DType dtype) override;
  // In place when recv == send + rank()*count (NCCL's convention); send == recv is allowed too, as with
  // the mpi backend: the input is read from recv and block rank() lands at its start.
  WorkPtr reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override;
  WorkPtr all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override;
  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root) override;
  // Grouped ncclSend/ncclRecv, one pair per peer (NCCL has no all-to-all of its own).
  WorkPtr all_to_all(const void* send, void* recv, size_t count, DType dtype) override;
  // A one-element all-reduce, then synchronize(): returns when every rank got there.
  void barrier() override;
  // ncclCommSplit; collective over this communicator. Needs NCCL >= 2.18.
  std::unique_ptr<Communicator> split(int color, int key) override;

  // Blocks the host until every collective issued so far completed, polling the watchdog; throws (after
  // aborting) on an NCCL error or when `timeout()` passes.
  void synchronize();
  // Throws if an armed collective failed or overran its deadline (after ncclCommAbort). Never blocks.
  void check_watchdog();
  void collect_device_stats() override;

  cudaStream_t compute_stream() const { return compute_stream_; }
  ncclComm_t handle() const { return comm_; }

  // A collective's completion event, shared by its Work and the watchdog.
  struct Event;
  // Called by a Work's wait(): the compute stream waits for `event`, and the watchdog watches it.
  void arm(std::shared_ptr<Event> event, Clock::time_point deadline, const std::string& what);
  // Host-side completion of `event`; checks NCCL's asynchronous error on the way.
  bool query(const Event& event, const std::string& what);

 private:
  NcclCommunicator(ncclComm_t comm, int device, cudaStream_t compute_stream, Clock::duration timeout);
  void init_resources();
  template <class Issue>
  WorkPtr start(Collective collective, size_t count, DType dtype, int reduce, int root, const std::string& what,
                Issue&& issue);
  [[noreturn]] void abort_and_fail(const std::string& what, const std::string& why);
  std::string describe(Collective c, size_t count, DType dtype, const char* detail) const;

  struct Armed {
    std::shared_ptr<Event> event;
    Clock::time_point deadline;
    std::string what;
  };
  // Timing events recorded on the compute stream just before and after it waits for a collective.
  struct Stall {
    cudaEvent_t begin = nullptr, end = nullptr;
  };

  ncclComm_t comm_ = nullptr;
  int device_ = 0;
  int rank_ = 0;
  int size_ = 1;
  cudaStream_t compute_stream_ = nullptr;
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t inputs_ready_ = nullptr;  // recorded on the compute stream before each collective
  // One device float for barrier(). From the stream-ordered pool: cudaFree would wait for the whole
  // device, stuck kernels of an aborted communicator included.
  std::unique_ptr<Buffer> barrier_scratch_;
  std::vector<Armed> armed_;
  std::vector<Stall> stalls_;  // not yet read back
  std::string aborted_;  // what made the watchdog abort; empty while healthy
};

}  // namespace zshard::comm
