// CopyStream on a GPU: a non-blocking CUDA stream of asynchronous copies, an event per mark.
#include <chrono>
#include <vector>

#include <zshard/error.h>

#include "kernels/copy_stream.h"
#include "kernels/cuda/runtime.h"

namespace zshard::cuda {

namespace {

class DeviceCopies final : public CopyStream {
 public:
  explicit DeviceCopies(int marks) {
    // Non-blocking: the compute stream may be the legacy default stream, which every blocking stream
    // synchronises with, and the copies are there to run while compute goes on.
    ZS_CUDA_CHECK(cudaStreamCreateWithFlags(&h_.stream, cudaStreamNonBlocking));
    h_.events.reserve(size_t(marks) + 1);
    for (int i = 0; i <= marks; ++i) {
      cudaEvent_t event = nullptr;
      ZS_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
      h_.events.push_back(event);
    }
  }

  void follow_compute() override {
    ZS_CUDA_CHECK(cudaEventRecord(h_.events[0], compute_stream()));
    ZS_CUDA_CHECK(cudaStreamWaitEvent(h_.stream, h_.events[0], 0));
  }

  void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) override {
    if (bytes == 0) return;
    const cudaMemcpyKind kind = src_device == Device::cpu   ? (dst_device == Device::cpu ? cudaMemcpyHostToHost
                                                                                        : cudaMemcpyHostToDevice)
                                : dst_device == Device::cpu ? cudaMemcpyDeviceToHost
                                                            : cudaMemcpyDeviceToDevice;
    ZS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, h_.stream));
  }

  void set_mark(int i) override { ZS_CUDA_CHECK(cudaEventRecord(mark(i), h_.stream)); }
  void host_waits(int i) override { wait_event(mark(i)); }
  void compute_waits(int i) override { ZS_CUDA_CHECK(cudaStreamWaitEvent(compute_stream(), mark(i), 0)); }

 private:
  cudaEvent_t mark(int i) const {
    ZS_CHECK(i >= 0 && size_t(i) + 1 < h_.events.size(), "CopyStream: no mark ", i);
    return h_.events[size_t(i) + 1];
  }

  // Destroyed also when the constructor throws half-way. The queued copies read and write buffers that
  // are freed right after this (pinned host memory among them), so they get up to 10 s to finish: bounded,
  // since a stream stuck behind a collective that never completes must not hang a job that is failing.
  struct Handles {
    cudaStream_t stream = nullptr;
    std::vector<cudaEvent_t> events;  // [0]: recorded on the compute stream; then the marks
    ~Handles() {
      if (stream) {
        became_idle(stream, std::chrono::seconds(10));
        cudaStreamDestroy(stream);
      }
      for (cudaEvent_t event : events) cudaEventDestroy(event);
    }
  } h_;
};

}  // namespace

std::unique_ptr<CopyStream> make_copy_stream(int marks) { return std::make_unique<DeviceCopies>(marks); }

}  // namespace zshard::cuda
