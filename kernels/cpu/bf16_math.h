// What the bf16 CPU ops share (kernels/cpu/bf16_ops.cpp, bf16_attention.cpp): fp32 working copies of bf16
// arrays, from the tracking allocator, and the GEMM's argument checks.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <zshard/dtype.h>
#include <zshard/tensor.h>

#include "kernels/cpu/ops.h"

namespace zshard::cpu::bf16_math {

// op(first, count) over [0, items) in blocks whose fp32 copies, `bytes_per_item` an item, fit
// kOpScratchBytes (kernels/cpu/ops.h): one block where all fit, at least one item a block, and blocks of
// even size, so that none is a sliver of a few rows (for which sgemm may take another kernel).
// block_items is their size.
inline size_t block_items(size_t items, size_t bytes_per_item) {
  if (items == 0) return 0;
  const size_t most = std::max<size_t>(1, kOpScratchBytes / std::max<size_t>(bytes_per_item, 1));
  const size_t blocks = (items + most - 1) / most;
  return (items + blocks - 1) / blocks;
}
template <class Op>
void in_blocks(size_t items, size_t bytes_per_item, Op&& op) {
  const size_t block = block_items(items, bytes_per_item);
  for (size_t first = 0; first < items; first += block) op(first, std::min(block, items - first));
}
// The fp32 copies such an op holds at once: its largest block's (what a model's workspace_bytes counts).
inline int64_t block_bytes(size_t items, size_t bytes_per_item) {
  return int64_t(block_items(items, bytes_per_item) * bytes_per_item);
}

// An fp32 copy of a bf16 array for the length of one op (Category::workspace). Made from a null pointer
// it is null too, so that an op's optional array (a bias, a position table) stays absent.
class Fp32 {
 public:
  explicit Fp32(size_t n);             // uninitialised: an output the op sets
  Fp32(const bf16* values, size_t n);  // the values, widened exactly
  // `rows` rows of `cols` elements, `ld` apart, copied `cols` apart.
  Fp32(const bf16* values, int rows, int cols, int ld);
  float* get() const { return absent_ ? nullptr : static_cast<float*>(buffer_.data()); }
  // The one rounding of an op's result: dst[i] = bf16(get()[i]), over the whole array, or its `rows` rows
  // of `cols` into rows `ld` apart.
  void round_into(bf16* dst) const;
  void round_rows_into(bf16* dst, int rows, int cols, int ld) const;

 private:
  size_t n_;
  bool absent_;
  Buffer buffer_;
};

// gemm's checks of its sizes and strides, which the bf16 GEMM makes before it reads the operands
// (kernels/cpu/gemm.cpp).
void check_gemm_args(bool trans_a, bool trans_b, int M, int N, int K, int lda, int ldb, int ldc);

}  // namespace zshard::cpu::bf16_math
