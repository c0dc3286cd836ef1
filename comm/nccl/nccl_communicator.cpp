#include "comm/nccl/nccl_communicator.h"

#include <cstdlib>
#include <thread>
#include <vector>

#include <zshard/error.h>

#include "comm/flight_recorder/recorder.h"
#include "comm/mpi_communicator.h"
#include "kernels/option_names.h"
#include "kernels/cuda/runtime.h"

namespace zshard::comm {

struct NcclCommunicator::Event {
  cudaEvent_t handle = nullptr;
  uint64_t trace = 0;  // the flight recorder's id of the collective it ends
  // Timing off: the cheapest event, and the only kind a record/query/wait needs.
  Event() { ZS_CUDA_CHECK(cudaEventCreateWithFlags(&handle, cudaEventDisableTiming)); }
  ~Event() { cudaEventDestroy(handle); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

namespace {

class NcclWork final : public Work {
 public:
  NcclWork(NcclCommunicator* comm, std::shared_ptr<NcclCommunicator::Event> event)
      : comm_(comm), event_(std::move(event)) {}

  // The flight recorder learns of the end when the host sees it: here, or in the watchdog once armed.
  bool test() override {
    if (!done_) done_ = comm_->query(*event_, what_);
    if (done_) record_end(event_->trace, trace::State::completed);
    return done_;
  }
  // Stream-ordered: the compute stream waits on the device, the host returns at once. The deadline is
  // enforced by the communicator's watchdog. Once test() has seen the collective finish there is
  // nothing left to order.
  void wait(Clock::time_point deadline) override {
    if (done_) return;
    record_waiting(event_->trace);  // the compute stream now waits for it
    comm_->arm(event_, deadline, what_);
  }
  using Work::wait;

 private:
  NcclCommunicator* comm_;
  std::shared_ptr<NcclCommunicator::Event> event_;
  bool done_ = false;
};

ncclDataType_t nccl_type(DType dtype, const std::string& what) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i32: return ncclInt32;
    case DType::u16: break;
  }
  fail(what, ": the nccl backend does not reduce ", dtype_name(dtype));
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::avg ? ncclAvg : ncclSum; }

// Every live communicator, so that a host blocked on the device runs all their watchdogs.
std::vector<NcclCommunicator*>& live_communicators() {
  static std::vector<NcclCommunicator*> live;
  return live;
}

void check_all_watchdogs() {
  for (NcclCommunicator* c : live_communicators()) c->check_watchdog();
}

int env_int(const char* name) {
  const char* value = std::getenv(name);
  return value && *value ? std::atoi(value) : -1;
}

}  // namespace

int local_rank(Communicator& world) {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"})
    if (int r = env_int(name); r >= 0) return r;
  if (auto* mpi = dynamic_cast<MpiCommunicator*>(&world)) {
    MPI_Comm node = MPI_COMM_NULL;
    ZS_MPI_CHECK(MPI_Comm_split_type(mpi->handle(), MPI_COMM_TYPE_SHARED, mpi->rank(), MPI_INFO_NULL, &node));
    int r = 0;
    ZS_MPI_CHECK(MPI_Comm_rank(node, &r));
    MPI_Comm_free(&node);
    return r;
  }
  return 0;
}

int local_device(Communicator& world) {
  int count = 0;
  ZS_CUDA_CHECK(cudaGetDeviceCount(&count));
  ZS_CHECK(count > 0, "no CUDA device visible to rank ", world.rank());
  return local_rank(world) % count;
}

NcclCommunicator::NcclCommunicator(Communicator& bootstrap, int device, cudaStream_t compute_stream)
    : device_(device), compute_stream_(compute_stream) {
  ZS_CHECK(bootstrap.device() == Device::cpu, "nccl bootstrap: the id travels through host memory, but the ",
           bootstrap.backend(), " communicator takes device buffers");
  ZS_CUDA_CHECK(cudaSetDevice(device_));
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) ZS_NCCL_CHECK(ncclGetUniqueId(&id));
  static_assert(sizeof(id) % 2 == 0, "the id is broadcast as 16-bit words");
  bootstrap.broadcast(&id, sizeof(id) / 2, DType::u16, 0)->wait();
  ZS_NCCL_CHECK(ncclCommInitRank(&comm_, bootstrap.size(), id, bootstrap.rank()));
  set_timeout(bootstrap.timeout());
  init_resources();
  set_trace_group(derive_group(bootstrap, ":nccl", size_, rank_));
}

NcclCommunicator::NcclCommunicator(ncclComm_t comm, int device, cudaStream_t compute_stream,
                                   Clock::duration timeout)
    : comm_(comm), device_(device), compute_stream_(compute_stream) {
  set_timeout(timeout);
  init_resources();
}

void NcclCommunicator::init_resources() {
  ZS_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
  ZS_NCCL_CHECK(ncclCommCount(comm_, &size_));
  // Non-blocking: the comm stream must not serialise with the legacy default stream.
  ZS_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
  ZS_CUDA_CHECK(cudaEventCreateWithFlags(&inputs_ready_, cudaEventDisableTiming));
  barrier_scratch_ = std::make_unique<Buffer>(sizeof(float), Device::cuda, Category::comm);
  live_communicators().push_back(this);
  cuda::set_wait_hook(check_all_watchdogs);
}

// Teardown reports nothing: after an abort or a failed job the handles may already be unusable. With
// collectives still queued after a grace second (an exception unwound a step) ncclCommDestroy would wait
// for peers that may never come, so the communicator is aborted instead; after a clean run the comm
// stream is idle. Once any collective of the process has failed there is no grace second either.
NcclCommunicator::~NcclCommunicator() {
  std::erase(live_communicators(), this);
  if (comm_) {
    if (!collectives_failed() && cuda::became_idle(comm_stream_, std::chrono::seconds(1)))
      ncclCommDestroy(comm_);
    else
      ncclCommAbort(comm_);
  }
  if (inputs_ready_) cudaEventDestroy(inputs_ready_);
  if (comm_stream_) cudaStreamDestroy(comm_stream_);
  for (const Stall& s : stalls_) {
    cudaEventDestroy(s.begin);
    cudaEventDestroy(s.end);
  }
}

std::string NcclCommunicator::describe(Collective c, size_t count, DType dtype, const char* detail) const {
  return detail::concat(collective_name(c), " of ", count, " ", dtype_name(dtype), " elements", detail,
                        " on rank ", rank_, " of ", size_, " (nccl)");
}

// `what` may name an armed collective (check_watchdog passes its Armed::what): the message is composed
// before armed_ is cleared, which frees that string.
void NcclCommunicator::abort_and_fail(const std::string& what, const std::string& why) {
  aborted_ = what + ": " + why;
  mark_collectives_failed();
  if (comm_) ncclCommAbort(comm_);  // makes the stuck NCCL kernels exit so the streams drain
  comm_ = nullptr;
  for (const Armed& a : armed_) record_end(a.event->trace, trace::State::failed);
  armed_.clear();
  fail(aborted_, "; the nccl communicator was aborted");
}

bool NcclCommunicator::query(const Event& event, const std::string& what) {
  ZS_CHECK(aborted_.empty(), "nccl communicator unusable, aborted after: ", aborted_);
  const cudaError_t rc = cudaEventQuery(event.handle);
  if (rc == cudaSuccess) return true;
  if (rc != cudaErrorNotReady) cuda::cuda_fail(rc, "cudaEventQuery (" + what + ")", __FILE__, __LINE__);
  ncclResult_t async = ncclSuccess;
  ZS_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
  if (async != ncclSuccess && async != ncclInProgress)
    abort_and_fail(what, std::string("NCCL asynchronous error: ") + ncclGetErrorString(async));
  return false;
}

void NcclCommunicator::check_watchdog() {
  ZS_CHECK(aborted_.empty(), "nccl communicator unusable, aborted after: ", aborted_);
  const auto now = Clock::now();
  for (size_t i = 0; i < armed_.size();) {
    const Armed& a = armed_[i];
    if (query(*a.event, a.what)) {
      record_end(a.event->trace, trace::State::completed);
      armed_[i] = std::move(armed_.back());
      armed_.pop_back();
      continue;
    }
    if (now >= a.deadline) {
      record_end(a.event->trace, trace::State::timed_out);
      abort_and_fail(a.what, detail::concat("timed out, still running ", seconds(now - a.deadline),
                                            " s past its deadline; a rank of the group failed or did not "
                                            "issue the same collective (",
                                            option_name(Option::comm_timeout), " sets the deadline)"));
    }
    ++i;
  }
}

void NcclCommunicator::arm(std::shared_ptr<Event> event, Clock::time_point deadline,
                           const std::string& what) {
  check_watchdog();
  Stall stall;
  ZS_CUDA_CHECK(cudaEventCreate(&stall.begin));
  ZS_CUDA_CHECK(cudaEventCreate(&stall.end));
  ZS_CUDA_CHECK(cudaEventRecord(stall.begin, compute_stream_));
  ZS_CUDA_CHECK(cudaStreamWaitEvent(compute_stream_, event->handle, 0));
  ZS_CUDA_CHECK(cudaEventRecord(stall.end, compute_stream_));
  stalls_.push_back(stall);
  armed_.push_back({std::move(event), deadline, what});
}

void NcclCommunicator::collect_device_stats() {
  for (size_t i = 0; i < stalls_.size();) {
    const Stall s = stalls_[i];
    const cudaError_t rc = cudaEventQuery(s.end);
    if (rc == cudaErrorNotReady) {
      ++i;
      continue;
    }
    ZS_CUDA_CHECK(rc);
    float ms = 0;
    ZS_CUDA_CHECK(cudaEventElapsedTime(&ms, s.begin, s.end));
    stats_.seconds_waiting += ms / 1e3;
    cudaEventDestroy(s.begin);
    cudaEventDestroy(s.end);
    stalls_[i] = stalls_.back();
    stalls_.pop_back();
  }
}

void NcclCommunicator::synchronize() {
  const auto begin = Clock::now();
  const auto deadline = timeout_ >= Clock::time_point::max() - begin ? Clock::time_point::max()
                                                                     : begin + timeout_;
  Event all;
  ZS_CUDA_CHECK(cudaEventRecord(all.handle, comm_stream_));
  const std::string what = detail::concat("synchronize on rank ", rank_, " of ", size_, " (nccl)");
  // Polling rather than cudaEventSynchronize: the host must be free to give up at the deadline.
  while (!query(all, what)) {
    check_watchdog();
    if (Clock::now() >= deadline) abort_and_fail(what, "timed out waiting for the collectives in flight");
    std::this_thread::yield();
  }
  check_watchdog();
  stats_.seconds_waiting += seconds(Clock::now() - begin);
}

// What the collectives share: the watchdog, ordering after the compute stream, the completion event,
// the byte count and the deadline. `issue` enqueues the NCCL call on the comm stream.
template <class Issue>
WorkPtr NcclCommunicator::start(Collective collective, size_t count, DType dtype, int reduce, int root,
                                const std::string& what, Issue&& issue) {
  check_watchdog();
  ZS_CUDA_CHECK(cudaEventRecord(inputs_ready_, compute_stream_));
  ZS_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, inputs_ready_, 0));
  const uint64_t trace = record_issue(trace_group_, collective, count, dtype, reduce, root);
  if (const ncclResult_t rc = issue(); rc != ncclSuccess) {
    record_end(trace, trace::State::failed);
    fail(what, ": NCCL call failed: ", ncclGetErrorString(rc), " (", ncclGetLastError(comm_), ")");
  }
  auto event = std::make_shared<Event>();
  event->trace = trace;
  ZS_CUDA_CHECK(cudaEventRecord(event->handle, comm_stream_));

  const bool per_rank_blocks = collective == Collective::all_gather || collective == Collective::reduce_scatter ||
                               collective == Collective::all_to_all;
  const int64_t buffer_bytes = int64_t(count * dtype_size(dtype)) * (per_rank_blocks ? size_ : 1);
  this->count(collective, bus_bytes(collective, size_, buffer_bytes));
  auto work = std::make_unique<NcclWork>(this, std::move(event));
  work->set_default_deadline(timeout_, what);
  return work;
}

// Moves are typeless: all_gather and broadcast send bytes, so every dtype (u16 included) travels.
WorkPtr NcclCommunicator::all_gather(const void* send, void* recv, size_t count, DType dtype) {
  const size_t bytes = count * dtype_size(dtype);
  return start(Collective::all_gather, count, dtype, -1, -1, describe(Collective::all_gather, count, dtype, ""),
               [&] { return ncclAllGather(send, recv, bytes, ncclUint8, comm_, comm_stream_); });
}

WorkPtr NcclCommunicator::reduce_scatter(const void* send, void* recv, size_t count, DType dtype,
                                         ReduceOp op) {
  const std::string what =
      describe(Collective::reduce_scatter, count, dtype, op == ReduceOp::avg ? " (avg)" : " (sum)");
  const ncclDataType_t type = nccl_type(dtype, what);
  const size_t block_bytes = count * dtype_size(dtype);
  return start(Collective::reduce_scatter, count, dtype, int(op), -1, what, [&] {
    if (send != recv) return ncclReduceScatter(send, recv, count, type, nccl_op(op), comm_, comm_stream_);
    // Input in recv: reduce in place into block rank(), then move the block to the front.
    char* own = static_cast<char*>(recv) + size_t(rank_) * block_bytes;
    const ncclResult_t rc = ncclReduceScatter(recv, own, count, type, nccl_op(op), comm_, comm_stream_);
    if (rc == ncclSuccess && rank_ != 0)
      ZS_CUDA_CHECK(cudaMemcpyAsync(recv, own, block_bytes, cudaMemcpyDeviceToDevice, comm_stream_));
    return rc;
  });
}

WorkPtr NcclCommunicator::all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  const std::string what =
      describe(Collective::all_reduce, count, dtype, op == ReduceOp::avg ? " (avg)" : " (sum)");
  const ncclDataType_t type = nccl_type(dtype, what);
  return start(Collective::all_reduce, count, dtype, int(op), -1, what,
               [&] { return ncclAllReduce(buf, buf, count, type, nccl_op(op), comm_, comm_stream_); });
}

WorkPtr NcclCommunicator::broadcast(void* buf, size_t count, DType dtype, int root) {
  ZS_CHECK(root >= 0 && root < size_, "broadcast from root ", root, " in a group of ", size_, " ranks");
  const size_t bytes = count * dtype_size(dtype);
  const std::string what =
      describe(Collective::broadcast, count, dtype, (" from root " + std::to_string(root)).c_str());
  return start(Collective::broadcast, count, dtype, -1, root, what,
               [&] { return ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm_, comm_stream_); });
}

WorkPtr NcclCommunicator::all_to_all(const void* send, void* recv, size_t count, DType dtype) {
  const std::string what = describe(Collective::all_to_all, count, dtype, "");
  ZS_CHECK(send != recv, what, ": send and recv must be distinct buffers");
  const size_t bytes = count * dtype_size(dtype);
  return start(Collective::all_to_all, count, dtype, -1, -1, what, [&] {
    ncclResult_t rc = ncclGroupStart();
    for (int peer = 0; peer < size_ && rc == ncclSuccess; ++peer) {
      rc = ncclSend(static_cast<const char*>(send) + size_t(peer) * bytes, bytes, ncclUint8, peer, comm_, comm_stream_);
      if (rc == ncclSuccess)
        rc = ncclRecv(static_cast<char*>(recv) + size_t(peer) * bytes, bytes, ncclUint8, peer, comm_, comm_stream_);
    }
    // A group once started must end, even after a failed call, or NCCL stays inside it.
    const ncclResult_t end = ncclGroupEnd();
    return rc != ncclSuccess ? rc : end;
  });
}

// Not counted in the stats, as with the mpi backend.
void NcclCommunicator::barrier() {
  check_watchdog();
  // The scratch came from the stream-ordered pool on the compute stream: order the comm stream after it.
  ZS_CUDA_CHECK(cudaEventRecord(inputs_ready_, compute_stream_));
  ZS_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, inputs_ready_, 0));
  void* scratch = barrier_scratch_->data();
  ZS_NCCL_CHECK(ncclAllReduce(scratch, scratch, 1, ncclFloat32, ncclSum, comm_, comm_stream_));
  synchronize();
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key) {
  ZS_CHECK(color >= 0, "split color must be >= 0, got ", color);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
  check_watchdog();
  ncclComm_t group = nullptr;
  ZS_NCCL_CHECK(ncclCommSplit(comm_, color, key, &group, nullptr));
  std::unique_ptr<NcclCommunicator> result(new NcclCommunicator(group, device_, compute_stream_, timeout_));
  result->set_trace_group(derive_group(*this, detail::concat(":", color), result->size(), result->rank()));
  return result;
#else
  (void)key;
  fail("split of the nccl communicator needs NCCL >= 2.18 (ncclCommSplit); this build has ",
       NCCL_VERSION_CODE);
#endif
}

}  // namespace zshard::comm
