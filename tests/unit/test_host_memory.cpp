// What the offloaded optimizer's host side stands on, checked on the cpu: Category::host buffers come from
// the source installed for them (page-locked memory on the CUDA path), and the cpu's CopyStream copies at
// once, skips a copy onto itself and never waits.
#include <gtest/gtest.h>

#include <cstdlib>
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
