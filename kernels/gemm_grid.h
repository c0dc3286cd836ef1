// The operands of a batched GEMM seen as a grid of heads x batches matrices: matrix (b, h) of an operand
// starts b * batch + h * head elements after its base. Attention needs both strides: the heads of a
// position are hs apart inside its qkv row, batch elements T * 3C apart, so no single stride reaches all
// B * NH slices and one GEMM launch can still cover them.
#pragma once
#include <cstddef>
#include <cstdint>

// The offsets are computed on the host (the CPU plan test) and in kernels/cuda's pointer kernel alike.
#include "kernels/host_device.h"

namespace zshard {

struct GridStrides {
  long long head = 0, batch = 0;
  ZS_HOST_DEVICE long long offset(int b, int h) const { return b * batch + h * head; }
};

struct GemmGrid {
  int heads = 1, batches = 1;
  ZS_HOST_DEVICE int count() const { return heads * batches; }
};

// Whether every matrix of an operand with this base address and these strides starts 16-byte aligned.
// cuBLAS cannot look inside a pointer array when it picks a kernel, so kernels/cuda's gemm_grid takes
// that path only for operands its vectorised loads are made for.
inline bool grid_aligned(const void* base, GridStrides s, size_t element_size) {
  constexpr size_t kAlign = 16;
  return reinterpret_cast<uintptr_t>(base) % kAlign == 0 && s.head * element_size % kAlign == 0 &&
         s.batch * element_size % kAlign == 0;
}

}  // namespace zshard
