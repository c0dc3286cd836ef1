// What the bf16 CPU ops share (kernels/cpu/bf16_ops.cpp, bf16_attention.cpp): fp32 working copies of bf16
// arrays, from the tracking allocator, and the GEMM's argument checks.
#pragma once
#include <cstddef>

#include <zshard/dtype.h>
#include <zshard/tensor.h>

namespace zshard::cpu::bf16_math {

// An fp32 copy of a bf16 array for the length of one op (Category::workspace). Made from a null pointer
// it is null too, so that an op's optional array (a bias, a position table) stays absent.
class Fp32 {
 public:
  explicit Fp32(size_t n);             // uninitialised: an output the op sets
  Fp32(const bf16* values, size_t n);  // the values, widened exactly
  // `rows` rows of `cols` elements, `ld` apart, in the same layout; the elements between rows are 0.
  Fp32(const bf16* values, int rows, int cols, int ld);
  float* get() const { return absent_ ? nullptr : static_cast<float*>(buffer_.data()); }
  // The one rounding of an op's result: dst[i] = bf16(get()[i]), over the whole array or its rows.
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
