// The MPI backend: non-blocking MPI collectives, completed by polling MPI_Test so that wait() honours its
// deadline. Reductions are zshard's own rings of point-to-point messages (comm/ring_reduction.h), not
// MPI's: they take f32, f64, i32 and bf16 (each step of a bf16 sum in fp32, rounded once, as NCCL's).
// Element counts above INT_MAX per rank are rejected (MPI counts are int). Buffers may be host or device
// memory: device buffers go to a CUDA-aware MPI as they are where MPI only moves them, and through host
// copies otherwise (a reduction, whose sums run on the host, or an MPI that cannot read device memory), so
// that several ranks can share one GPU (which NCCL refuses).
#pragma once
#include <mpi.h>

#include <optional>
#include <string_view>

#include <zshard/communicator.h>

#include "comm/backend_base.h"

namespace zshard::comm {

// Throws zshard::Error with file:line, the failing call and MPI's error string.
[[noreturn]] void mpi_fail(int code, std::string_view call, const char* file, int line);

#define ZS_MPI_CHECK(call)                                                  \
  do {                                                                      \
    if (int zs_mpi_rc_ = (call); zs_mpi_rc_ != MPI_SUCCESS)                 \
      ::zshard::comm::mpi_fail(zs_mpi_rc_, #call, __FILE__, __LINE__);      \
  } while (0)

class MpiCommunicator final : public Backend {
 public:
  // Wraps `comm` and makes its MPI errors return (and so throw) instead of aborting. With `owned`, the
  // communicator is freed at destruction (split results); MPI_COMM_WORLD is passed unowned.
  // `timeout` is the first Work's deadline, the set-up's own wait included (set_timeout changes it).
  explicit MpiCommunicator(MPI_Comm comm, bool owned = false, Clock::duration timeout = std::chrono::minutes(5));
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  MPI_Comm handle() const { return comm_; }

  // In place when send == recv + rank()*count (MPI_IN_PLACE).
  WorkPtr all_gather(const void* send, void* recv, size_t count, DType dtype) override;
  // send == recv is allowed too: the input is read from recv and block rank() lands at its start.
  WorkPtr reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override;
  WorkPtr reduce_scatter_consuming(void* send, void* recv, size_t count, DType dtype, ReduceOp op) override;
  WorkPtr all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override;
  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root) override;
  WorkPtr all_to_all(const void* send, void* recv, size_t count, DType dtype) override;
  // Non-blocking barrier waited with the communicator's timeout.
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key) override;

 private:
  struct Op {
    Collective collective;
    size_t count;
    DType dtype;
    std::optional<ReduceOp> reduce;  // reductions only
    int root = -1;                   // broadcast only
  };
  // `send` is null for the in-place-only collectives (all_reduce, broadcast) and may point into `recv`.
  template <class Issue>
  WorkPtr start(const Op& op, const void* send, void* recv, Issue&& issue);
  WorkPtr start_ring(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, bool consume);
  std::string describe(const Op& op) const;
  // A non-blocking barrier waited with the communicator's timeout; `what` names it in the deadline's message.
  void barrier_for(std::string_view what);

  MPI_Comm comm_;
  // The rings' point-to-point messages travel on a duplicate of comm_, so that they never match a
  // receive of the user's own on it.
  MPI_Comm ring_comm_ = MPI_COMM_NULL;
  bool owned_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace zshard::comm
