#include "comm/self_communicator.h"

#include <zshard/error.h>

#include "comm/flight_recorder/recorder.h"
#include "comm/polling_work.h"
#include "kernels/device_memory.h"

namespace zshard::comm {

namespace {
class CompletedWork final : public PollingWork {
 public:
  using PollingWork::PollingWork;

 private:
  bool poll() override { return true; }
};

// In place, send and recv are the same buffer; either may be device memory (the world of one a GPU run
// reduces over).
void copy(const void* send, void* recv, size_t count, DType dtype) {
  if (send != recv && count > 0)
    copy_bytes(recv, pointer_device(recv), send, pointer_device(send), count * dtype_size(dtype));
}
}  // namespace

WorkPtr SelfCommunicator::done(Collective c, size_t count, DType dtype, int reduce, int root) {
  this->count(c, bus_bytes(c, 1, 0));
  auto work = std::make_unique<CompletedWork>(&stats_);
  work->set_trace(record_issue(trace_group_, c, count, dtype, reduce, root));
  return work;
}

WorkPtr SelfCommunicator::all_gather(const void* send, void* recv, size_t count, DType dtype) {
  copy(send, recv, count, dtype);
  return done(Collective::all_gather, count, dtype, -1, -1);
}

WorkPtr SelfCommunicator::reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
  copy(send, recv, count, dtype);  // the sum, or the average, of one contribution
  return done(Collective::reduce_scatter, count, dtype, int(op), -1);
}

WorkPtr SelfCommunicator::all_reduce(void*, size_t count, DType dtype, ReduceOp op) {
  return done(Collective::all_reduce, count, dtype, int(op), -1);
}

WorkPtr SelfCommunicator::broadcast(void*, size_t count, DType dtype, int root) {
  ZS_CHECK(root == 0, "broadcast from root ", root, " in a group of one rank");
  return done(Collective::broadcast, count, dtype, -1, root);
}

WorkPtr SelfCommunicator::all_to_all(const void* send, void* recv, size_t count, DType dtype) {
  copy(send, recv, count, dtype);
  return done(Collective::all_to_all, count, dtype, -1, -1);
}

std::unique_ptr<Communicator> SelfCommunicator::split(int color, int) {
  ZS_CHECK(color >= 0, "split color must be >= 0, got ", color);
  auto group = std::make_unique<SelfCommunicator>();
  group->set_timeout(timeout_);
  group->set_trace_group(derive_group(*this, detail::concat(":", color), 1, 0));
  return group;
}

}  // namespace zshard::comm
