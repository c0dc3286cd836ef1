#include "comm/mpi_communicator.h"

#include <mpi-ext.h>  // MPIX_CUDA_AWARE_SUPPORT, where this MPI has it

#include <climits>
#include <cstdio>
#include <functional>

#include <zshard/error.h>

#include "comm/flight_recorder/recorder.h"
#include "comm/abort.h"
#include "comm/polling_work.h"
#include "comm/ring_reduction.h"
#include "kernels/allocator.h"
#include "kernels/device_memory.h"
#include "kernels/engine_ops.h"

namespace zshard::comm {

namespace {

// MPI has no average: the sum is divided by the group size once the operation completes.
struct Average {
  void* buf;
  size_t count;
  DType dtype;
  int group_size;
};

template <class T>
void divide(T* values, size_t count, int by) {
  for (size_t i = 0; i < count; ++i) values[i] /= T(by);
}

void apply(const Average& avg) {
  if (avg.dtype == DType::f32) divide(static_cast<float*>(avg.buf), avg.count, avg.group_size);
  else divide(static_cast<double*>(avg.buf), avg.count, avg.group_size);
}

// MPI that reads GPU memory itself (CUDA-aware); Debian's OpenMPI is not, so device buffers are staged.
bool mpi_reads_device_memory() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

// Host copies of device buffers for an MPI that cannot read GPU memory: the input is copied to the host
// before the call, the result copied back once it completes. Pageable host memory and blocking copies:
// this path exists so that several ranks can share one GPU in tests; real GPU runs use nccl.
struct Staging {
  std::unique_ptr<Buffer> send, recv;
  void* device_recv = nullptr;
  size_t result_bytes = 0;
};

class MpiWork final : public PollingWork {
 public:
  MpiWork(CommStats* stats, std::optional<Average> average, std::unique_ptr<Staging> staging)
      : PollingWork(stats), average_(average), staging_(std::move(staging)) {}
  ~MpiWork() override;
  MPI_Request* request() { return &request_; }
  // The operation is this ring instead of an MPI request.
  void set_ring(std::unique_ptr<RingReduction> ring) { ring_ = std::move(ring); }
  // The buffers MPI was given are host copies of the caller's, private to this operation.
  bool staged() const { return staging_ != nullptr; }

 private:
  bool poll() override {
    progress_rings();  // every ring of the process, as MPI_Test moves every operation of MPI's own
    if (ring_) {
      if (!ring_->finished()) return false;
    } else {
      int flag = 0;
      ZS_MPI_CHECK(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE));
      if (!flag) return false;
    }
    if (average_) apply(*average_);
    if (staging_)
      copy_bytes(staging_->device_recv, Device::cuda, staging_->recv->data(), Device::cpu,
                 staging_->result_bytes);
    return true;
  }

  MPI_Request request_ = MPI_REQUEST_NULL;
  std::unique_ptr<RingReduction> ring_;
  std::optional<Average> average_;
  std::unique_ptr<Staging> staging_;
};

// MPI forbids freeing the request of a collective, and the operation may still write into the caller's
// buffers: finish it before they can be released. If that fails the job is broken, so end it rather than
// leave peers waiting. Once a collective has failed (a wait timed out, an MPI call failed) the error on
// its way up has reported it and the caller aborts: waiting here would only add another deadline.
MpiWork::~MpiWork() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (done() || abandoned() || finalized || collectives_failed()) return;
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zshard: %s\n", e.what());
    abort_world(1);
  }
}

// Two-byte types (bf16, f16, u16) travel as opaque 16-bit words: fine for moving; the rings sum bf16, the
// others not at all.
MPI_Datatype mpi_type(DType dtype, bool reduction, const std::string& what) {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT;
    case DType::bf16:
    case DType::f16:
    case DType::u16:
      if (!reduction || dtype == DType::bf16) return MPI_UINT16_T;
      break;
  }
  fail(what, ": the mpi backend reduces only f32, f64, i32 and bf16");
}

}  // namespace

void mpi_fail(int code, std::string_view call, const char* file, int line) {
  mark_collectives_failed();
  char message[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, message, &length) != MPI_SUCCESS) length = 0;
  fail(file, ":", line, ": ", call, " failed: ", length ? std::string(message, length) : "MPI error",
       " (code ", code, ")");
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, bool owned, Clock::duration timeout) : comm_(comm), owned_(owned) {
  timeout_ = timeout;
  ZS_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  ZS_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  ZS_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  // Waited with a deadline, as every collective here: a rank that never comes must not hang the others.
  MpiWork dup(nullptr, std::nullopt, nullptr);
  ZS_MPI_CHECK(MPI_Comm_idup(comm_, &ring_comm_, dup.request()));
  dup.set_default_deadline(timeout_, detail::concat("the duplicate of a communicator of ", size_,
                                                    " ranks for its reductions, on rank ", rank_, " (mpi)"));
  dup.wait();
  ZS_MPI_CHECK(MPI_Comm_set_errhandler(ring_comm_, MPI_ERRORS_RETURN));
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // after MPI_Finalize the handles are gone anyway
  if (ring_comm_ != MPI_COMM_NULL) MPI_Comm_free(&ring_comm_);
  if (owned_) MPI_Comm_free(&comm_);
}

std::string MpiCommunicator::describe(const Op& op) const {
  return detail::concat(collective_name(op.collective), " of ", op.count, " ", dtype_name(op.dtype),
                        " elements", op.reduce == ReduceOp::avg ? " (avg)" : op.reduce ? " (sum)" : "",
                        op.root >= 0 ? " from root " + std::to_string(op.root) : "", " on rank ", rank_,
                        " of ", size_, " (mpi)");
}

// What the collectives share: checks, staging of device buffers, the Work, the byte count and the
// deadline. `issue` starts the MPI operation on the (possibly staged) buffers, `send` being MPI_IN_PLACE
// for the in-place forms, as the Work's request or its ring, and returns MPI's error code.
template <class Issue>
WorkPtr MpiCommunicator::start(const Op& op, const void* send, void* recv, Issue&& issue) {
  const std::string what = describe(op);
  ZS_CHECK(op.count <= size_t(INT_MAX), what, ": the mpi backend takes at most ", INT_MAX,
           " elements per rank; split the buffer");
  const MPI_Datatype type = mpi_type(op.dtype, op.reduce.has_value(), what);
  const bool per_rank_blocks = op.collective == Collective::all_gather ||
                               op.collective == Collective::reduce_scatter || op.collective == Collective::all_to_all;
  const size_t block_bytes = op.count * dtype_size(op.dtype);
  const size_t full_bytes = block_bytes * (per_rank_blocks ? size_ : 1);
  // In place, the input is read from recv: all_reduce and broadcast always, all_gather when send is this
  // rank's block of recv, reduce_scatter when send is recv.
  const char* own_block = static_cast<char*>(recv) + rank_ * block_bytes;
  const bool in_place =
      send == nullptr || send == (op.collective == Collective::all_gather ? own_block : recv);
  // Extent of recv, and of the result in it: reduce_scatter's block lands at the start of recv.
  const size_t recv_bytes =
      op.collective == Collective::reduce_scatter && !in_place ? block_bytes : full_bytes;
  const size_t result_bytes = op.collective == Collective::reduce_scatter ? block_bytes : full_bytes;

  std::unique_ptr<Staging> staging;
  const bool device_buffers =
      pointer_device(recv) == Device::cuda || (send && pointer_device(send) == Device::cuda);
  // The rings sum on the host, and avg divides there once they complete: the device buffers of a
  // reduction are always staged.
  const bool host_arithmetic = op.reduce.has_value();
  if (device_buffers && mpi_reads_device_memory() && !host_arithmetic) {
    // A CUDA-aware MPI reads and writes device memory from this thread, outside stream order: the
    // kernels that produce the input (queued on the compute stream) must have finished first.
    ops::synchronize(Device::cuda);
  } else if (device_buffers) {
    staging = std::make_unique<Staging>();
    staging->device_recv = recv;
    staging->result_bytes = result_bytes;
    staging->recv = std::make_unique<Buffer>(recv_bytes, Device::cpu, Category::comm);
    void* host_recv = staging->recv->data();
    if (in_place) {
      copy_bytes(host_recv, Device::cpu, recv, Device::cuda, recv_bytes);
    } else {
      const size_t send_bytes = op.collective == Collective::all_gather ? block_bytes : full_bytes;
      staging->send = std::make_unique<Buffer>(send_bytes, Device::cpu, Category::comm);
      copy_bytes(staging->send->data(), Device::cpu, send, pointer_device(send), send_bytes);
      send = staging->send->data();
    }
    recv = host_recv;
  }

  std::optional<Average> average;
  if (op.reduce == ReduceOp::avg) {
    ZS_CHECK(op.dtype == DType::f32 || op.dtype == DType::f64, what, ": avg needs f32 or f64");
    average = Average{recv, op.count, op.dtype, size_};
  }
  auto work = std::make_unique<MpiWork>(&stats_, average, std::move(staging));
  const uint64_t trace = record_issue(trace_group_, op.collective, op.count, op.dtype,
                                      op.reduce ? int(*op.reduce) : -1, op.root);
  work->set_trace(trace);
  if (int rc = issue(in_place ? MPI_IN_PLACE : send, recv, int(op.count), type, *work);
      rc != MPI_SUCCESS) {
    record_end(trace, trace::State::failed);
    mpi_fail(rc, what, __FILE__, __LINE__);
  }

  count(op.collective, bus_bytes(op.collective, size_, int64_t(full_bytes)));
  work->set_default_deadline(timeout_, what);
  return work;
}

WorkPtr MpiCommunicator::all_gather(const void* send, void* recv, size_t count, DType dtype) {
  const Op spec{Collective::all_gather, count, dtype, {}};
  return start(spec, send, recv, [&](const void* in, void* out, int n, MPI_Datatype type, MpiWork& work) {
    return MPI_Iallgather(in, n, type, out, n, type, comm_, work.request());
  });
}

WorkPtr MpiCommunicator::reduce_scatter(const void* send, void* recv, size_t count, DType dtype,
                                        ReduceOp op) {
  return start_ring(send, recv, count, dtype, op, false);
}

WorkPtr MpiCommunicator::reduce_scatter_consuming(void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
  // The ring receives into recv at every step, while send's blocks still hold what it sums.
  const auto* in = static_cast<const char*>(send);
  const auto* out = static_cast<const char*>(recv);
  const size_t block = count * dtype_size(dtype);
  ZS_CHECK(out + block <= in || in + block * size_t(size_) <= out || block == 0,
           describe({Collective::reduce_scatter, count, dtype, op}), ": a consumed send must not overlap recv");
  return start_ring(send, recv, count, dtype, op, true);
}

// The ring may sum in the input when the caller gave it up, or when it is a staged copy of device memory.
WorkPtr MpiCommunicator::start_ring(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                    bool consume) {
  const Op spec{Collective::reduce_scatter, count, dtype, op};
  return start(spec, send, recv, [&](const void* in, void* out, int, MPI_Datatype type, MpiWork& work) {
    work.set_ring(RingReduction::reduce_scatter(ring_comm_, in == MPI_IN_PLACE ? out : in, out, count, dtype, type,
                                                consume || work.staged()));
    return MPI_SUCCESS;
  });
}

WorkPtr MpiCommunicator::all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  const Op spec{Collective::all_reduce, count, dtype, op};
  return start(spec, nullptr, buf, [&](const void*, void* out, int, MPI_Datatype type, MpiWork& work) {
    work.set_ring(RingReduction::all_reduce(ring_comm_, out, count, dtype, type));
    return MPI_SUCCESS;
  });
}

WorkPtr MpiCommunicator::broadcast(void* buf, size_t count, DType dtype, int root) {
  ZS_CHECK(root >= 0 && root < size_, "broadcast from root ", root, " in a group of ", size_, " ranks");
  const Op spec{Collective::broadcast, count, dtype, {}, root};
  return start(spec, nullptr, buf, [&](const void*, void* out, int n, MPI_Datatype type, MpiWork& work) {
    return MPI_Ibcast(out, n, type, root, comm_, work.request());
  });
}

WorkPtr MpiCommunicator::all_to_all(const void* send, void* recv, size_t count, DType dtype) {
  const Op spec{Collective::all_to_all, count, dtype, {}};
  ZS_CHECK(send != recv, describe(spec), ": send and recv must be distinct buffers");
  return start(spec, send, recv, [&](const void* in, void* out, int n, MPI_Datatype type, MpiWork& work) {
    return MPI_Ialltoall(in, n, type, out, n, type, comm_, work.request());
  });
}

void MpiCommunicator::barrier() { barrier_for("barrier"); }

void MpiCommunicator::barrier_for(std::string_view what) {
  MpiWork work(&stats_, std::nullopt, nullptr);
  ZS_MPI_CHECK(MPI_Ibarrier(comm_, work.request()));
  work.set_default_deadline(timeout_, detail::concat(what, " on rank ", rank_, " of ", size_, " (mpi)"));
  work.wait();
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  ZS_CHECK(color >= 0, "split color must be >= 0, got ", color);
  // MPI_Comm_split blocks with no deadline (MPI has no non-blocking split): a rank that never comes, one
  // failed or returned before setting up its engine, would hang the others for good. Once every rank has
  // passed the barrier, the split only exchanges the colours.
  barrier_for("the split into process groups");
  MPI_Comm group = MPI_COMM_NULL;
  ZS_MPI_CHECK(MPI_Comm_split(comm_, color, key, &group));
  auto result = std::make_unique<MpiCommunicator>(group, true, timeout_);
  result->set_trace_group(derive_group(*this, detail::concat(":", color), result->size(), result->rank()));
  return result;
}

}  // namespace zshard::comm
