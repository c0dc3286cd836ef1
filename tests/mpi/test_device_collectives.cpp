// zshard-test-np: 1 2 4
// The mpi backend handed GPU memory, as when several ranks share one GPU (NCCL refuses that): the checks
// of collective_checks.h run through a communicator that moves every buffer to the device first, so the
// mpi backend sees only device pointers, in place and aliasing cases included. Skips without a GPU.
#include <gtest/gtest.h>

#include <functional>

#include <zshard/communicator.h>
#include <zshard/error.h>

#include "kernels/allocator.h"
#include "kernels/device_memory.h"
#include "tests/mpi/collective_checks.h"
#include "tests/support/test_support.h"

#ifdef ZSHARD_WITH_CUDA
#include "kernels/cuda/runtime.h"
#endif

namespace zshard::comm {
namespace {

using test::world;
using namespace test_checks;

// Forwards to `inner` with device copies of the caller's host buffers: send is mapped into the device
// copy of recv when it points into recv (in place), and the result is copied back after the wait.
class DeviceBuffers final : public Communicator {
 public:
  explicit DeviceBuffers(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backend() const override { return inner_.backend(); }

  WorkPtr all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    const size_t block = count * dtype_size(dtype), full = block * size();
    return run(send, block, recv, full, full,
               [&](const void* s, void* r) { return inner_.all_gather(s, r, count, dtype); });
  }
  WorkPtr reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    const size_t block = count * dtype_size(dtype), full = block * size();
    return run(send, full, recv, send == recv ? full : block, block,
               [&](const void* s, void* r) { return inner_.reduce_scatter(s, r, count, dtype, op); });
  }
  WorkPtr all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    const size_t bytes = count * dtype_size(dtype);
    return run(nullptr, 0, buf, bytes, bytes,
               [&](const void*, void* r) { return inner_.all_reduce(r, count, dtype, op); });
  }
  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root) override {
    const size_t bytes = count * dtype_size(dtype);
    return run(nullptr, 0, buf, bytes, bytes,
               [&](const void*, void* r) { return inner_.broadcast(r, count, dtype, root); });
  }
  WorkPtr all_to_all(const void* send, void* recv, size_t count, DType dtype) override {
    const size_t full = count * dtype_size(dtype) * size();
    return run(send, full, recv, full, full,
               [&](const void* s, void* r) { return inner_.all_to_all(s, r, count, dtype); });
  }
  void barrier() override { inner_.barrier(); }
  std::unique_ptr<Communicator> split(int, int) override { fail("DeviceBuffers: no split"); }

 private:
  struct Done final : Work {
    bool test() override { return true; }
    void wait(Clock::time_point) override {}
  };

  WorkPtr run(const void* send, size_t send_bytes, void* recv, size_t recv_bytes, size_t result_bytes,
              const std::function<WorkPtr(const void*, void*)>& issue) {
    const auto device_copy = [](const void* host, size_t bytes) {
      auto b = std::make_unique<Buffer>(bytes, Device::cuda, Category::workspace);
      copy_bytes(b->data(), Device::cuda, host, Device::cpu, bytes);
      return b;
    };
    const auto dev_recv = device_copy(recv, recv_bytes);
    char* dev_recv_ptr = static_cast<char*>(dev_recv->data());
    const char* host_recv = static_cast<const char*>(recv);
    const char* s = static_cast<const char*>(send);
    const bool aliased = s && s >= host_recv && s < host_recv + recv_bytes;
    const auto dev_send = send && !aliased ? device_copy(send, send_bytes) : nullptr;
    const void* dev_send_ptr = !send ? nullptr : aliased ? dev_recv_ptr + (s - host_recv) : dev_send->data();
    EXPECT_EQ(pointer_device(dev_recv_ptr), Device::cuda);
    issue(dev_send_ptr, dev_recv_ptr)->wait();
    copy_bytes(recv, Device::cpu, dev_recv_ptr, Device::cuda, result_bytes);
    return std::make_unique<Done>();
  }

  Communicator& inner_;
};

class DeviceCollectives : public ::testing::Test {
 protected:
  void SetUp() override {
#ifdef ZSHARD_WITH_CUDA
    if (cuda::cuda_available()) {
      cuda::cuda_init(0);  // every rank on the first GPU: sharing one is the point
      return;
    }
#endif
    GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(DeviceCollectives, EveryCollectiveOnDeviceBuffers) {
  DeviceBuffers comm(world());
  const auto members = all_ranks(comm.size());
  for (size_t count : kCounts) {
    for (bool in_place : {false, true}) {
      check_all_gather<float>(comm, members, count, in_place);
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg})
        check_reduce_scatter<float>(comm, members, count, op, in_place);
    }
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) check_all_reduce<double>(comm, members, count, op);
    for (int root = 0; root < comm.size(); ++root) check_broadcast<float>(comm, members, count, root);
    check_all_to_all<float>(comm, members, count);
  }
}

}  // namespace
}  // namespace zshard::comm
