#include "kernels/device_timer.h"

#include <zshard/error.h>

#ifdef ZSHARD_WITH_CUDA
#include "kernels/cuda/runtime.h"
#endif

namespace zshard {

#ifdef ZSHARD_WITH_CUDA
namespace {
cudaEvent_t event(void* e) { return static_cast<cudaEvent_t>(e); }
}  // namespace
#endif

DeviceTimer::DeviceTimer(Device device) : device_(device) {
  if (device_ == Device::cpu) return;
#ifdef ZSHARD_WITH_CUDA
  for (void*& e : events_) {
    cudaEvent_t created = nullptr;
    ZS_CUDA_CHECK(cudaEventCreate(&created));  // with timing: the one thing these events are for
    e = created;
  }
#else
  fail("DeviceTimer: this zshard was built without the CUDA path (configure with -DZSHARD_CUDA=ON)");
#endif
}

DeviceTimer::~DeviceTimer() {
#ifdef ZSHARD_WITH_CUDA
  for (void* e : events_)
    if (e) cudaEventDestroy(event(e));
#endif
}

void DeviceTimer::start() {
  start_ = std::chrono::steady_clock::now();
#ifdef ZSHARD_WITH_CUDA
  if (device_ != Device::cpu) ZS_CUDA_CHECK(cudaEventRecord(event(events_[0]), cuda::compute_stream()));
#endif
}

void DeviceTimer::stop() {
  stop_ = std::chrono::steady_clock::now();
#ifdef ZSHARD_WITH_CUDA
  if (device_ != Device::cpu) ZS_CUDA_CHECK(cudaEventRecord(event(events_[1]), cuda::compute_stream()));
#endif
}

double DeviceTimer::elapsed_ms() const {
#ifdef ZSHARD_WITH_CUDA
  if (device_ != Device::cpu) {
    float ms = 0;
    ZS_CUDA_CHECK(cudaEventElapsedTime(&ms, event(events_[0]), event(events_[1])));
    return ms;
  }
#endif
  return std::chrono::duration<double, std::milli>(stop_ - start_).count();
}

}  // namespace zshard
