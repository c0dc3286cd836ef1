// What the GPU tests share (tests/unit/test_cuda_*.cpp, test_nccl_one_rank.cpp): device 0 selected once,
// the skip where there is no GPU, and device copies of host vectors. For CUDA builds only.
#pragma once
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "kernels/cuda/runtime.h"

namespace zshard::test {

// False without a usable GPU; otherwise selects device 0 once (allocator and copy hooks included).
inline bool gpu_ready() {
  static const bool ready = [] {
    if (!cuda::cuda_available()) return false;
    cuda::cuda_init(0);
    return true;
  }();
  return ready;
}

// A device copy of a host vector; host() reads it back.
template <class T>
class DeviceVector {
 public:
  explicit DeviceVector(const std::vector<T>& host) : n_(host.size()) {
    ZS_CUDA_CHECK(cudaMalloc(&ptr_, n_ * sizeof(T)));
    ZS_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceVector() { cudaFree(ptr_); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  T* get() const { return ptr_; }
  std::vector<T> host() const {
    std::vector<T> out(n_);
    ZS_CUDA_CHECK(cudaMemcpy(out.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }

 private:
  size_t n_;
  T* ptr_ = nullptr;
};

}  // namespace zshard::test

#define ZS_REQUIRE_GPU() \
  if (!::zshard::test::gpu_ready()) GTEST_SKIP() << "no CUDA device"
