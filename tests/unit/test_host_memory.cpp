// What the offloaded optimizer's host side stands on, checked on the cpu: Category::host buffers come from
// the source installed for them (page-locked memory on the CUDA path), a large host buffer freed is reused
// without faulting its pages in again, and the cpu's CopyStream copies at once, skips a copy onto itself
// and never waits.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include <zshard/error.h>
#include <zshard/tensor.h>

#include "kernels/allocator.h"
#include "kernels/copy_stream.h"

namespace zshard {
namespace {

int g_allocated = 0, g_released = 0;
void* counting_allocate(size_t bytes) {
  ++g_allocated;
  return std::malloc(bytes);
}
void counting_release(void* p) {
  ++g_released;
  std::free(p);
}
void* other_allocate(size_t bytes) { return std::malloc(bytes); }

TEST(HostMemory, HostCategoryComesFromItsOwnSource) {
  Allocator& host = Allocator::of(Device::cpu);
  host.set_host_category_raw({counting_allocate, counting_release});
  {
    const Tensor state = Tensor::zeros({16}, DType::f32, Device::cpu, Category::host);
    const Tensor other = Tensor::zeros({16}, DType::f32, Device::cpu, Category::params);
    EXPECT_EQ(g_allocated, 1);
    // The source of live host-category buffers cannot change (each goes back to where it came from), but
    // installing the same one again is harmless.
    EXPECT_THROW(host.set_host_category_raw({other_allocate, counting_release}), Error);
    EXPECT_NO_THROW(host.set_host_category_raw({counting_allocate, counting_release}));
  }
  EXPECT_EQ(g_released, 1);
  host.set_host_category_raw({});  // back to the host's ordinary memory
  const Tensor plain = Tensor::zeros({16}, DType::f32, Device::cpu, Category::host);
  EXPECT_EQ(g_allocated, 1);
}

long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Page faults of writing every byte of `bytes` at `data`.
long faults_to_fill(void* data, size_t bytes) {
  const long before = minor_faults();
  std::memset(data, 1, bytes);
  EXPECT_EQ(static_cast<volatile char*>(data)[bytes - 1], 1);
  return minor_faults() - before;
}

// A large buffer freed and allocated again, as a step's unsharded gradients are, comes back from the heap
// without its pages faulted in again.
TEST(HostMemory, ALargeBufferFreedIsNotFaultedInAgain) {
  if (!Allocator::of(Device::cpu).keeps_freed_memory()) GTEST_SKIP() << "glibc's malloc is tuned by the environment";
  constexpr size_t kBytes = size_t(96) << 20;
  const auto fill_buffer = [] {
    std::unique_ptr<char[]> beside;  // a small block allocated after the buffer and freed after it
    const Buffer buffer(kBytes, Device::cpu, Category::comm);
    beside = std::make_unique<char[]>(1000);
    return faults_to_fill(buffer.data(), kBytes);
  };
  fill_buffer();  // the first time: faulted in
  long again = 0;
  for (int step = 0; step < 3; ++step) again += fill_buffer();
  // What a block the kernel maps anew costs, for scale (fewer faults where huge pages back it).
  void* fresh = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(fresh, MAP_FAILED);
  const long anew = faults_to_fill(fresh, kBytes);
  munmap(fresh, kBytes);
  EXPECT_LT(again * 10, anew) << again << " faults to fill a reused buffer 3 times, " << anew << " for a new block";
}

TEST(HostMemory, CpuCopyStreamCopiesAtOnce) {
  const std::unique_ptr<CopyStream> copies = CopyStream::make(Device::cpu, 2);
  std::vector<float> a = {1, 2, 3}, b(3);
  copies->follow_compute();
  copies->copy(b.data(), Device::cpu, a.data(), Device::cpu, 3 * sizeof(float));
  EXPECT_EQ(b, a);  // before any mark: nothing is ever in flight on the cpu
  copies->copy(a.data(), Device::cpu, a.data(), Device::cpu, 3 * sizeof(float));  // onto itself: nothing
  copies->set_mark(1);
  copies->host_waits(1);
  copies->compute_waits(1);
  EXPECT_EQ(a, (std::vector<float>{1, 2, 3}));
  EXPECT_THROW(CopyStream::make(Device::cpu, -1), Error);
}

}  // namespace
}  // namespace zshard
