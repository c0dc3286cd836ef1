// The operands of a batched GEMM seen as a grid of heads x batches matrices: matrix (b, h) of an operand
// starts b * batch + h * head elements after its base. Attention needs both strides: the heads of a
// position are hs apart inside its qkv row, batch elements T * 3C apart, so no single stride reaches all
// B * NH slices and one GEMM launch can still cover them.
#pragma once

namespace zshard {

struct GridStrides {
  long long head = 0, batch = 0;
  long long offset(int b, int h) const { return b * batch + h * head; }
};

struct GemmGrid {
  int heads = 1, batches = 1;
  int count() const { return heads * batches; }
};

}  // namespace zshard
