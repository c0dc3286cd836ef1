// The NCCL backend (comm/nccl) on one GPU as a communicator of one rank: every collective called directly,
// with inputs written on the compute stream just before it (so a collective that did not wait for the
// compute stream would read stale data) and results read on the compute stream after wait() (so a wait
// that did not order the compute stream would read stale results); all-gather and reduce-scatter in place
// and out of place, all-reduce and reduce-scatter in f32 and bf16, sum and avg, broadcast, split, and the
// watchdog: a collective stalled behind the compute stream overruns its deadline, the communicator is
// aborted and says so, and refuses every later call. A second rank on the same GPU is refused by NCCL, so
// this is all of NCCL one GPU can show. Without a GPU every test skips; without ZSHARD_WITH_CUDA the file
// is a single skipped test.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#ifdef ZSHARD_WITH_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <zshard/error.h>

#include "comm/backend_base.h"
#include "comm/nccl/nccl_communicator.h"
#include "comm/self_communicator.h"
#include "kernels/cuda/runtime.h"
#include "tests/support/gpu_test.h"
#include "tests/support/test_support.h"

namespace zshard::comm {
namespace {

using ::testing::HasSubstr;

// The one-rank NCCL communicator, bootstrapped through the self communicator as a world of one would be.
std::unique_ptr<NcclCommunicator> one_rank() {
  SelfCommunicator self;
  auto comm = std::make_unique<NcclCommunicator>(self, 0);
  comm->set_timeout(std::chrono::seconds(60));
  return comm;
}

// A device buffer of `n` elements of T, written and read with copies queued on the compute stream (the
// legacy default stream), which the collectives must be ordered with.
template <class T>
class DeviceVec {
 public:
  explicit DeviceVec(size_t n) : n_(n) { ZS_CUDA_CHECK(cudaMalloc(&ptr_, n * sizeof(T))); }
  ~DeviceVec() { cudaFree(ptr_); }
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;
  T* get() const { return ptr_; }
  void write(const std::vector<T>& values) {
    staged_ = values;
    ZS_CUDA_CHECK(cudaMemcpyAsync(ptr_, staged_.data(), n_ * sizeof(T), cudaMemcpyHostToDevice, nullptr));
  }
  std::vector<T> read() const {
    std::vector<T> out(n_);
    ZS_CUDA_CHECK(cudaMemcpyAsync(out.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost, nullptr));
    cuda::synchronize_stream(nullptr);
    return out;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
  std::vector<T> staged_;
};

std::vector<float> iota(size_t n, float start) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + 0.5f * float(i);
  return v;
}

TEST(NcclOneRank, IsARankOfOne) {
  ZS_REQUIRE_GPU();
  auto comm = one_rank();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->backend(), "nccl");
  EXPECT_EQ(comm->device(), Device::cuda);
}

TEST(NcclOneRank, AllGatherInPlaceAndOutOfPlace) {
  ZS_REQUIRE_GPU();
  auto comm = one_rank();
  const size_t n = 1000;
  DeviceVec<float> send(n), recv(n);
  send.write(iota(n, 1));
  recv.write(std::vector<float>(n, -1));
  comm->all_gather(send.get(), recv.get(), n, DType::f32)->wait();
  EXPECT_EQ(recv.read(), iota(n, 1));
  recv.write(iota(n, 7));  // in place: rank 0's block is the whole buffer
  comm->all_gather(recv.get(), recv.get(), n, DType::f32)->wait();
  EXPECT_EQ(recv.read(), iota(n, 7));
  EXPECT_EQ(comm->stats().calls[int(Collective::all_gather)], 2);
  EXPECT_EQ(comm->stats().total_bytes(), 0) << "a group of one moves nothing";
}

TEST(NcclOneRank, ReduceScatterInPlaceAndOutOfPlace) {
  ZS_REQUIRE_GPU();
  auto comm = one_rank();
  const size_t n = 513;
  DeviceVec<float> send(n), recv(n);
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
    send.write(iota(n, 3));
    recv.write(std::vector<float>(n, -1));
    comm->reduce_scatter(send.get(), recv.get(), n, DType::f32, op)->wait();
    EXPECT_EQ(recv.read(), iota(n, 3));
    recv.write(iota(n, 5));  // send == recv: the backend's in-place form
    comm->reduce_scatter(recv.get(), recv.get(), n, DType::f32, op)->wait();
    EXPECT_EQ(recv.read(), iota(n, 5));
  }
}

TEST(NcclOneRank, ReductionsInBf16) {
  ZS_REQUIRE_GPU();
  auto comm = one_rank();
  const size_t n = 257;
  std::vector<__nv_bfloat16> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = __float2bfloat16(0.25f * float(i) - 3.f);
  DeviceVec<__nv_bfloat16> buf(n), out(n);
  const auto as_bits = [](const std::vector<__nv_bfloat16>& v) {
    std::vector<uint16_t> b(v.size());
    std::memcpy(b.data(), v.data(), v.size() * sizeof(uint16_t));
    return b;
  };
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
    buf.write(values);
    comm->all_reduce(buf.get(), n, DType::bf16, op)->wait();
    EXPECT_EQ(as_bits(buf.read()), as_bits(values));
    buf.write(values);
    comm->reduce_scatter(buf.get(), out.get(), n, DType::bf16, op)->wait();
    EXPECT_EQ(as_bits(out.read()), as_bits(values));
  }
}

TEST(NcclOneRank, AllReduceAndBroadcast) {
  ZS_REQUIRE_GPU();
  auto comm = one_rank();
  const size_t n = 4099;
  DeviceVec<float> buf(n);
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
    buf.write(iota(n, -2));
    comm->all_reduce(buf.get(), n, DType::f32, op)->wait();
    EXPECT_EQ(buf.read(), iota(n, -2));
  }
  buf.write(iota(n, 11));
  comm->broadcast(buf.get(), n, DType::f32, 0)->wait();
  EXPECT_EQ(buf.read(), iota(n, 11));
  EXPECT_THAT(test::error_of([&] { comm->broadcast(buf.get(), n, DType::f32, 1); }),
              HasSubstr("broadcast from root 1 in a group of 1 ranks"));
  EXPECT_NO_THROW(comm->barrier());
  EXPECT_NO_THROW(comm->synchronize());
}

TEST(NcclOneRank, SplitGivesAWorkingCommunicator) {
  ZS_REQUIRE_GPU();
  auto comm = one_rank();
  const std::unique_ptr<Communicator> part = comm->split(0, 0);
  ASSERT_EQ(part->size(), 1);
  EXPECT_EQ(part->backend(), "nccl");
  const size_t n = 100;
  DeviceVec<float> buf(n);
  buf.write(iota(n, 9));
  part->all_reduce(buf.get(), n, DType::f32, ReduceOp::sum)->wait();
  EXPECT_EQ(buf.read(), iota(n, 9));
  EXPECT_EQ(part->timeout(), comm->timeout());
}

// Test-only host callback: holds the compute stream until released.
void CUDART_CB hold_until_released(void* flag) {
  auto* released = static_cast<std::atomic<bool>*>(flag);
  while (!released->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// Last in the file: an abort marks the process's collectives as failed (comm/polling_work.h), which
// later teardowns honour. ctest runs each test in a process of its own anyway.
TEST(NcclOneRank, WatchdogAbortsAStalledCollectiveAtItsDeadline) {
  ZS_REQUIRE_GPU();
  auto comm = one_rank();
  const size_t n = 64;
  DeviceVec<float> buf(n);
  buf.write(iota(n, 1));
  cuda::synchronize_stream(nullptr);
  // The collective waits for the compute stream, which a host callback holds: it cannot finish. The stall
  // is released from another thread after the deadline, so that the abort (which may wait for the streams
  // NCCL shares with this one) returns, and the device drains.
  std::atomic<bool> released{false};
  ZS_CUDA_CHECK(cudaLaunchHostFunc(nullptr, hold_until_released, &released));
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    released = true;
  });
  const auto start = Clock::now();
  WorkPtr work = comm->all_reduce(buf.get(), n, DType::f32, ReduceOp::sum);
  work->wait(Clock::now() + std::chrono::milliseconds(300));  // arms the deadline; the host returns at once
  EXPECT_FALSE(work->test());
  const std::string error = test::error_of([&] { comm->synchronize(); });
  const double waited = std::chrono::duration<double>(Clock::now() - start).count();
  release.join();
  EXPECT_THAT(error, HasSubstr("all_reduce of 64 f32 elements (sum) on rank 0 of 1 (nccl)"));
  EXPECT_THAT(error, HasSubstr("timed out"));
  EXPECT_THAT(error, HasSubstr("the nccl communicator was aborted"));
  EXPECT_LT(waited, 30.0) << "the watchdog fired late";
  EXPECT_THAT(test::error_of([&] { comm->all_reduce(buf.get(), n, DType::f32, ReduceOp::sum); }),
              HasSubstr("nccl communicator unusable, aborted after"));
  EXPECT_TRUE(collectives_failed());
  EXPECT_TRUE(cuda::became_idle(nullptr, std::chrono::seconds(30))) << "the compute stream did not drain";
}

}  // namespace
}  // namespace zshard::comm

#else

TEST(NcclOneRank, SkippedWithoutCudaBuild) { GTEST_SKIP() << "built without ZSHARD_WITH_CUDA"; }

#endif
