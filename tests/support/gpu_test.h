// What the GPU tests share (tests/unit/test_cuda_*.cpp, test_nccl_one_rank.cpp): device 0 selected once,
// and the skip where there is no GPU. For CUDA builds only.
#pragma once
#include <gtest/gtest.h>

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

}  // namespace zshard::test

#define ZS_REQUIRE_GPU() \
  if (!::zshard::test::gpu_ready()) GTEST_SKIP() << "no CUDA device"
