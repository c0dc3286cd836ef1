// The device's time over a span of the work queued on it, measured without the host waiting for the
// device: marks in the compute stream's queue (CUDA events on a GPU), read once the host has waited for
// the device past them anyway (a training step's one read at its end). On the cpu the ops run as the host
// calls them, so the host's clock is the device's.
#pragma once
#include <chrono>

#include <zshard/dtype.h>

namespace zshard {

class DeviceTimer {
 public:
  explicit DeviceTimer(Device device);
  ~DeviceTimer();
  DeviceTimer(const DeviceTimer&) = delete;
  DeviceTimer& operator=(const DeviceTimer&) = delete;

  void start();  // marks where the span begins among the work queued so far
  void stop();   // and where it ends
  // Milliseconds from start() to stop() on the device; once the host has waited for the device past stop().
  double elapsed_ms() const;

 private:
  Device device_;
  std::chrono::steady_clock::time_point start_, stop_;  // cpu
  void* events_[2] = {nullptr, nullptr};                 // cuda: cudaEvent_t
};

}  // namespace zshard
