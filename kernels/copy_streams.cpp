// CopyStream::make: the copy stream of each device (the host copies at once; queued_copies.h for the
// tests; a CUDA stream on a GPU), chosen here above their implementations.
#include "kernels/copy_stream.h"

#include <zshard/error.h>

#include "kernels/device_memory.h"
#include "kernels/queued_copies.h"

#ifdef ZSHARD_WITH_CUDA
#include "kernels/cuda/runtime.h"
#endif

namespace zshard {

namespace {

// The host is the device: copies happen when queued, so there is never anything to wait for.
class HostCopies final : public CopyStream {
 public:
  void follow_compute() override {}
  void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) override {
    if (dst != src) copy_bytes(dst, dst_device, src, src_device, bytes);
  }
  void set_mark(int) override {}
  void host_waits(int) override {}
  void compute_waits(int) override {}
};

}  // namespace

std::unique_ptr<CopyStream> CopyStream::make(Device device, int marks) {
  ZS_CHECK(marks >= 0, "CopyStream: negative number of marks ", marks);
  if (device == Device::cpu) {
    if (std::unique_ptr<CopyStream> queued = make_test_copy_stream(marks)) return queued;
    return std::make_unique<HostCopies>();
  }
#ifdef ZSHARD_WITH_CUDA
  return cuda::make_copy_stream(marks);
#else
  fail("CopyStream on ", device_name(device), ": this zshard was built without the CUDA path");
#endif
}

}  // namespace zshard
