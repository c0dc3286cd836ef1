// Block quantization on the GPU against the CPU reference, through ops:: as the engine calls it: the same
// bits for the scales, the payload and the dequantized values, overwritten and accumulated (a NaN only has
// to be a NaN: its payload is the hardware's), in blocks of one piece and of many uneven ones. Without a
// GPU every test skips.
#include <gtest/gtest.h>

#ifdef ZSHARD_WITH_CUDA
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/engine_ops.h"
#include "tests/support/gpu_test.h"

namespace zshard {
namespace {

using ops::QuantFormat;
using test::DeviceVector;

float widen(float x) { return x; }
float widen(bf16 x) { return float(x); }

// The same bits, or both NaN; the first mismatch is reported.
template <class T>
void expect_same_bits(const std::vector<T>& got, const std::vector<T>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(widen(got[i])) && std::isnan(widen(want[i]))) continue;
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(T)), 0)
        << what << " " << i << ": " << widen(got[i]) << " on cuda, " << widen(want[i]) << " on cpu";
  }
}

// Random values of magnitudes 1e-3 to 1e3 by stretches, then stretches that take the other paths: zeros,
// a NaN, infinities, ties (halves with qmax in every block of 7 or 64: scale 1), subnormal values (a
// subnormal scale, and one that underflows to 0).
template <class T>
std::vector<T> inputs(size_t n, int bits) {
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> dist(-1, 1);
  const int qmax = bits == 8 ? 127 : 7;
  std::uniform_int_distribution<int> halves(-2 * qmax, 2 * qmax);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = dist(rng) * std::pow(10.f, float(int(i / 500 % 7) - 3));
  for (size_t i = 0; i < 448; ++i) x[i] = 0;
  x[1000] = std::numeric_limits<float>::quiet_NaN();
  x[2000] = std::numeric_limits<float>::infinity();
  x[3000] = -std::numeric_limits<float>::infinity();
  for (size_t i = 4480; i < 8960; ++i) x[i] = i % 7 == 0 || i % 64 == 0 ? float(qmax) : 0.5f * float(halves(rng));
  for (size_t i = 8960; i < 9408; ++i) x[i] = dist(rng) * 1e-40f;
  for (size_t i = 9408; i < 9856; ++i) x[i] = dist(rng) * 1e-44f;
  return std::vector<T>(x.begin(), x.end());
}

// The n elements of inputs() in the pieces beginning at `piece_begin` (0 first, n last), quantized by both,
// each reading the table from its own memory.
template <class T>
void check_matches_cpu(QuantFormat f, const std::vector<int64_t>& piece_begin) {
  SCOPED_TRACE(testing::Message() << "block " << f.block << ", " << f.bits << " bits, " << piece_begin.size() - 1
                                  << " pieces");
  const size_t n = size_t(piece_begin.back());
  const ops::HostBlockTable table(piece_begin, f);
  const DeviceVector<int64_t> d_entries(table.entries());
  const ops::BlockTable on_cpu = table.host_table(), on_cuda = table.table_at(d_entries.get());
  const std::vector<T> x = inputs<T>(n, f.bits);
  const ops::QuantizedSize size = ops::quantized_size(n, f.bits, table.blocks());
  std::vector<int8_t> q(size.payload_bytes);
  std::vector<float> scales(size.scale_count);
  ops::quantize_blocks(Device::cpu, q.data(), scales.data(), x.data(), n, f, on_cpu);
  DeviceVector<T> d_x(x);
  DeviceVector<int8_t> d_q(std::vector<int8_t>(q.size(), int8_t(0x5a)));
  DeviceVector<float> d_scales(std::vector<float>(scales.size(), -1.f));
  ops::quantize_blocks(Device::cuda, d_q.get(), d_scales.get(), d_x.get(), n, f, on_cuda);
  expect_same_bits(d_scales.host(), scales, "scale");
  expect_same_bits(d_q.host(), q, "payload byte");

  std::mt19937 rng(17);
  std::uniform_real_distribution<float> dist(-100, 100);
  std::vector<T> start(n);
  for (T& e : start) e = T(dist(rng));
  for (bool accumulate : {false, true}) {
    std::vector<T> out = start;
    ops::dequantize_blocks(Device::cpu, out.data(), q.data(), scales.data(), n, f, on_cpu, accumulate);
    DeviceVector<T> d_out(start);
    ops::dequantize_blocks(Device::cuda, d_out.get(), d_q.get(), d_scales.get(), n, f, on_cuda, accumulate);
    expect_same_bits(d_out.host(), out, accumulate ? "accumulated element" : "dequantized element");
  }
}

constexpr int64_t kElements = 100003;

TEST(CudaQuantize, MatchesCpuBitForBit) {
  ZS_REQUIRE_GPU();
  for (QuantFormat f : {QuantFormat{64, 8}, QuantFormat{64, 4}, QuantFormat{7, 8}, QuantFormat{7, 4},
                        QuantFormat{4096, 8}, QuantFormat{1, 4}}) {
    check_matches_cpu<float>(f, {0, kElements});
    check_matches_cpu<bf16>(f, {0, kElements});
  }
}

// Pieces of every length from 1 up, at odd and even starts, a long one, and a short last one: blocks that
// end early wherever a piece does, 4-bit bytes shared by two pieces, and the search through many pieces.
TEST(CudaQuantize, MatchesCpuBitForBitWithUnevenPieces) {
  ZS_REQUIRE_GPU();
  std::vector<int64_t> piece_begin = {0};
  for (int64_t length = 1; piece_begin.back() + length < 20000; ++length)
    piece_begin.push_back(piece_begin.back() + length);
  piece_begin.push_back(kElements - 3);
  piece_begin.push_back(kElements);
  for (QuantFormat f : {QuantFormat{256, 8}, QuantFormat{64, 4}, QuantFormat{7, 4}}) {
    check_matches_cpu<float>(f, piece_begin);
    check_matches_cpu<bf16>(f, piece_begin);
  }
}

}  // namespace
}  // namespace zshard

#else

TEST(CudaQuantize, SkippedWithoutCudaBuild) { GTEST_SKIP() << "built without ZSHARD_WITH_CUDA"; }

#endif
