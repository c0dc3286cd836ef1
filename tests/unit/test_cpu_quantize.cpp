// Block quantization on the cpu (kernels/engine_ops.h's quantize_blocks), through ops:: as the engine calls
// it: exact results for hand-made blocks, the scale / 2 bound on random ones, zero and non-finite blocks,
// short last blocks, odd n with 4 bits, round trips, accumulation, a table of uneven pieces against a
// scalar reference, and the argument checks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels/engine_ops.h"
#include "tests/support/test_support.h"

namespace zshard {
namespace {

using ::testing::HasSubstr;
using ops::QuantFormat;
using test::error_of;

struct Quantized {
  std::vector<int8_t> q;
  std::vector<float> scales;
};

// n elements in one piece: blocks of f.block from the first element.
ops::HostBlockTable one_piece(size_t n, QuantFormat f) { return ops::HostBlockTable({0, int64_t(n)}, f); }

// The payload starts as a pattern the op must overwrite, padding nibble included.
template <class T>
Quantized quantize(const std::vector<T>& x, QuantFormat f, const ops::HostBlockTable& table) {
  const ops::QuantizedSize size = ops::quantized_size(x.size(), f.bits, table.blocks());
  Quantized out{std::vector<int8_t>(size.payload_bytes, int8_t(0x5a)), std::vector<float>(size.scale_count, -1.f)};
  ops::quantize_blocks(Device::cpu, out.q.data(), out.scales.data(), x.data(), x.size(), f, table.host_table());
  return out;
}
template <class T>
Quantized quantize(const std::vector<T>& x, QuantFormat f) {
  return quantize(x, f, one_piece(x.size(), f));
}

template <class T>
std::vector<T> dequantize(const Quantized& qz, size_t n, QuantFormat f, const ops::HostBlockTable& table,
                          std::vector<T> out = {}, bool accumulate = false) {
  out.resize(n, T(-1.f));
  ops::dequantize_blocks(Device::cpu, out.data(), qz.q.data(), qz.scales.data(), n, f, table.host_table(),
                         accumulate);
  return out;
}
template <class T>
std::vector<T> dequantize(const Quantized& qz, size_t n, QuantFormat f, std::vector<T> out = {},
                          bool accumulate = false) {
  return dequantize(qz, n, f, one_piece(n, f), std::move(out), accumulate);
}

template <class T>
std::vector<T> values(const std::vector<float>& x) {
  return std::vector<T>(x.begin(), x.end());
}
template <class T>
std::vector<float> floats(const std::vector<T>& x) {
  std::vector<float> out;
  for (T e : x) out.push_back(float(e));
  return out;
}

// Scales of 1 make every x / scale exact, so the ties show the rounding: to even (-2.5 -> -2, 3.5 -> 4,
// 63.5 -> 64, 0.5 -> 0). The last block is short and has a scale of its own.
template <class T>
void check_hand_made_int8_blocks() {
  const QuantFormat f{4, 8};
  const std::vector<float> x = {127, -2.5, 3.5, 0.5, 63.5, -127, 1.5, -0.5, 2, -0.5};
  const Quantized qz = quantize(values<T>(x), f);
  EXPECT_EQ(qz.q, (std::vector<int8_t>{127, -2, 4, 0, 64, -127, 2, 0, 127, -32}));  // -0.5 / (2/127) = -31.75
  EXPECT_EQ(qz.scales, (std::vector<float>{1, 1, 2.0f / 127}));
  const std::vector<float> want = {127, -2, 4, 0, 64, -127, 2, 0, 127 * (2.0f / 127), -32 * (2.0f / 127)};
  EXPECT_EQ(floats(dequantize<T>(qz, x.size(), f)), floats(values<T>(want)));
}
TEST(CpuQuantize, HandMadeInt8Blocks) {
  check_hand_made_int8_blocks<float>();
  check_hand_made_int8_blocks<bf16>();
}

// Element 2i in the low nibble, 2i + 1 in the high one; n = 7 leaves the last high nibble 0. With a block
// of 3, bytes 1 and 3 hold elements of two blocks each.
template <class T>
void check_hand_made_int4_blocks() {
  const std::vector<float> x = {7, -2.5, 0.5, -7, 7, 1.5, -6.5};
  const Quantized even = quantize(values<T>(x), {4, 4});
  EXPECT_EQ(even.q, (std::vector<int8_t>{int8_t(0xe7), int8_t(0x90), 0x27, 0x0a}));  // 7,-2 | 0,-7 | 7,2 | -6,0
  EXPECT_EQ(even.scales, (std::vector<float>{1, 1}));
  EXPECT_EQ(floats(dequantize<T>(even, x.size(), {4, 4})), (std::vector<float>{7, -2, 0, -7, 7, 2, -6}));

  const std::vector<float> y = {7, -3.5, 1, 2.5, -7, 0, 7};
  const Quantized odd = quantize(values<T>(y), {3, 4});
  EXPECT_EQ(odd.q, (std::vector<int8_t>{int8_t(0xc7), 0x21, 0x09, 0x07}));  // 7,-4 | 1,2 | -7,0 | 7,pad
  EXPECT_EQ(odd.scales, (std::vector<float>{1, 1, 1}));
  EXPECT_EQ(floats(dequantize<T>(odd, y.size(), {3, 4})), (std::vector<float>{7, -4, 1, 2, -7, 0, 7}));
}
TEST(CpuQuantize, HandMadeInt4BlocksPackTheLowNibbleFirst) {
  check_hand_made_int4_blocks<float>();
  check_hand_made_int4_blocks<bf16>();
}

// Blocks of magnitudes 1e-3 to 1e3, a short last one. The bound is scale / 2 from the rounding, plus what
// fp32 adds: x / scale rounded (up to 2^-18 scale near qmax) and the product q * scale rounded (up to
// 2^-17 scale): 2^-16 scale covers both. A bf16 result adds its own rounding, half an ulp (2^-8 relative).
template <class T>
void check_bound(QuantFormat f) {
  SCOPED_TRACE(testing::Message() << "block " << f.block << ", " << f.bits << " bits");
  const size_t n = 1000;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = dist(rng) * std::pow(10.f, float(int(i / f.block % 7) - 3));
  const std::vector<T> xt = values<T>(x);
  const Quantized qz = quantize(xt, f);
  const std::vector<T> back = dequantize<T>(qz, n, f);
  const float qmax = f.bits == 8 ? 127 : 7;
  const bool is_bf16 = std::is_same_v<T, bf16>;
  for (size_t b = 0; b < qz.scales.size(); ++b) {
    float absmax = 0;
    for (size_t i = b * f.block; i < std::min(n, (b + 1) * f.block); ++i)
      absmax = std::max(absmax, std::fabs(float(xt[i])));
    ASSERT_EQ(qz.scales[b], absmax / qmax) << "block " << b;
  }
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    const double scale = qz.scales[i / f.block], error = std::fabs(double(float(xt[i])) - double(float(back[i])));
    const double bound = scale * (0.5 + 0x1p-16) + (is_bf16 ? 0x1p-8 * std::fabs(double(float(back[i]))) : 0);
    ASSERT_LE(error, bound) << "element " << i << ": " << float(xt[i]) << " came back as " << float(back[i]);
    worst = std::max(worst, error / scale);
  }
  EXPECT_GT(worst, 0.45) << "no element near the bound: the test would not see a rounding that loses more";
}
TEST(CpuQuantize, EveryElementWithinHalfAScale) {
  for (QuantFormat f : {QuantFormat{64, 8}, QuantFormat{64, 4}, QuantFormat{7, 8}, QuantFormat{7, 4}}) {
    check_bound<float>(f);
    check_bound<bf16>(f);
  }
}

TEST(CpuQuantize, ZeroBlockHasScaleZeroAndDequantizesToZero) {
  const QuantFormat f{4, 4};
  const std::vector<float> x = {0, 0, -0.f, 0, 1, 2, 3, 7, 0, 0};
  const Quantized qz = quantize(x, f);
  EXPECT_EQ(qz.scales, (std::vector<float>{0, 1, 0}));
  EXPECT_EQ(dequantize<float>(qz, x.size(), f), (std::vector<float>{0, 0, 0, 0, 1, 2, 3, 7, 0, 0}));
  const std::vector<float> start = {5, 5, 5, 5, 5, 5, 5, 5, 5, 5};
  EXPECT_EQ(dequantize<float>(qz, x.size(), f, start, true), (std::vector<float>{5, 5, 5, 5, 6, 7, 8, 12, 5, 5}));
}

// Integers of [-qmax, qmax], each block holding qmax: scale 1, and every value comes back exactly.
template <class T>
void check_round_trip(int bits) {
  const QuantFormat f{4, bits};
  const int qmax = bits == 8 ? 127 : 7;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> dist(-qmax, qmax);
  std::vector<float> x(11);
  for (size_t i = 0; i < x.size(); ++i) x[i] = i % 4 == 1 ? float(qmax) : float(dist(rng));
  EXPECT_EQ(floats(dequantize<T>(quantize(values<T>(x), f), x.size(), f)), x) << bits << " bits";
}
TEST(CpuQuantize, RoundTripOfRepresentableValuesIsExact) {
  for (int bits : {8, 4}) {
    check_round_trip<float>(bits);
    check_round_trip<bf16>(bits);
  }
}

// The sum is taken in fp32 and rounded to bf16 once: rounding the dequantized value to bf16 first and then
// the sum would differ for some elements, which the test checks it has.
TEST(CpuQuantize, AccumulateAddsInFp32AndRoundsOnce) {
  const QuantFormat f{16, 8};
  const size_t n = 200;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-2, 2);
  std::vector<float> x(n), start(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = dist(rng);
    start[i] = float(bf16(dist(rng) * 64));
  }
  const Quantized qz = quantize(x, f);
  const std::vector<float> value = dequantize<float>(qz, n, f);
  EXPECT_EQ(dequantize<float>(qz, n, f, start, true), [&] {
    std::vector<float> sum(n);
    for (size_t i = 0; i < n; ++i) sum[i] = start[i] + value[i];
    return sum;
  }());
  const std::vector<bf16> got = dequantize<bf16>(qz, n, f, values<bf16>(start), true);
  int rounded_twice_differs = 0;
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(got[i].bits, bf16(start[i] + value[i]).bits) << i;
    rounded_twice_differs += bf16(start[i] + float(bf16(value[i]))).bits != got[i].bits;
  }
  EXPECT_GT(rounded_twice_differs, 0);
}

// A NaN or inf makes its block's scale non-finite and the whole block NaN; the other blocks are untouched.
TEST(CpuQuantize, NonFiniteValuePoisonsItsBlock) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (int bits : {8, 4}) {
    const QuantFormat f{3, bits};
    const std::vector<float> x = {1, nan, 2, 4, 5, 7, inf, 1, 2, 3, -inf, 9, 0, nan, inf};
    const Quantized qz = quantize(values<bf16>(x), f);
    EXPECT_TRUE(std::isnan(qz.scales[0]));
    EXPECT_EQ(qz.scales[1], 7.0f / (bits == 8 ? 127 : 7));
    EXPECT_EQ(qz.scales[2], inf);
    EXPECT_EQ(qz.scales[3], inf);
    EXPECT_TRUE(std::isnan(qz.scales[4]));  // the NaN wins over the inf after it
    const std::vector<float> back = floats(dequantize<bf16>(qz, x.size(), f));
    for (size_t i = 0; i < x.size(); ++i)
      EXPECT_EQ(std::isnan(back[i]), i / 3 != 1) << bits << " bits, element " << i << ": " << back[i];
  }
}

TEST(CpuQuantize, QuantizedSizeCountsPayloadAndScales) {
  const ops::QuantizedSize int8 = ops::quantized_size(1001, {64, 8});
  EXPECT_EQ(int8.payload_bytes, 1001u);
  EXPECT_EQ(int8.scale_count, 16u);
  EXPECT_EQ(int8.scales_offset(), 1004u);  // the scales aligned for float after the payload
  EXPECT_EQ(int8.bytes(), 1004u + 64);
  const ops::QuantizedSize int4 = ops::quantized_size(7, {3, 4});
  EXPECT_EQ(int4.payload_bytes, 4u);
  EXPECT_EQ(int4.scale_count, 3u);
  EXPECT_EQ(int4.bytes(), 4u + 12);
  EXPECT_EQ(ops::quantized_size(0, {64, 4}).bytes(), 0u);
}

// Pieces of 3, 7, 1, 29 and 5 elements, magnitudes 1e-3 to 1e2 apart, in blocks of at most 8: blocks of
// 3 | 7 | 1 | 8, 8, 8, 5 | 5, each with a scale of its own, against a scalar reference that cuts the same
// blocks by hand. Pieces that begin at odd elements put two blocks' elements into one 4-bit byte.
template <class T>
void check_uneven_table(int bits) {
  SCOPED_TRACE(testing::Message() << bits << " bits");
  const QuantFormat f{8, bits};
  const ops::HostBlockTable table({0, 3, 10, 11, 40, 45}, f);
  const std::vector<size_t> starts = {0, 3, 10, 11, 19, 27, 35, 40, 45};  // every block's, then the end
  const std::vector<float> magnitude = {1e-3f, 1.f, 1e2f, 1e-2f, 10.f};    // each piece's
  const std::vector<size_t> piece = {0, 1, 2, 3, 3, 3, 3, 4};              // each block's
  ASSERT_EQ(table.blocks(), starts.size() - 1);
  const size_t n = starts.back();
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> x(n);
  for (size_t b = 0; b + 1 < starts.size(); ++b)
    for (size_t i = starts[b]; i < starts[b + 1]; ++i) x[i] = dist(rng) * magnitude[piece[b]];
  const std::vector<T> xt = values<T>(x);

  const float qmax = bits == 8 ? 127 : 7;
  std::vector<float> scales, want_back(n);
  std::vector<int> integers(n);
  for (size_t b = 0; b + 1 < starts.size(); ++b) {
    float absmax = 0;
    for (size_t i = starts[b]; i < starts[b + 1]; ++i) absmax = std::max(absmax, std::fabs(float(xt[i])));
    scales.push_back(absmax / qmax);
    for (size_t i = starts[b]; i < starts[b + 1]; ++i) {
      integers[i] = int(std::rint(float(xt[i]) / scales.back()));
      want_back[i] = float(T(float(integers[i]) * scales.back()));
    }
  }
  std::vector<int8_t> payload;
  for (size_t i = 0; i < n; i += bits == 8 ? 1 : 2)
    payload.push_back(bits == 8 ? int8_t(integers[i])
                                : int8_t((integers[i] & 0xf) | ((i + 1 < n ? integers[i + 1] : 0) << 4)));

  const Quantized qz = quantize(xt, f, table);
  EXPECT_EQ(qz.scales, scales);
  EXPECT_EQ(qz.q, payload);
  EXPECT_EQ(floats(dequantize<T>(qz, n, f, table)), want_back);
}
TEST(CpuQuantize, UnevenTableGivesEachBlockItsOwnScale) {
  for (int bits : {8, 4}) {
    check_uneven_table<float>(bits);
    check_uneven_table<bf16>(bits);
  }
}

TEST(CpuQuantize, TablesOfOtherBlocksAndEmptyPiecesAreRefused) {
  std::vector<float> x(8), scales(8);
  std::vector<int8_t> q(8);
  const ops::HostBlockTable eights({0, 8}, {8, 8});
  const auto quantize_in_fours = [&] {
    ops::quantize_blocks(Device::cpu, q.data(), scales.data(), x.data(), 8, {4, 8}, eights.host_table());
  };
  EXPECT_THAT(error_of(quantize_in_fours),
              HasSubstr("quantize_blocks: a block table cut for blocks of 8 with a format of blocks of 4"));
  EXPECT_THAT(error_of([] { ops::HostBlockTable({0, 3, 3, 8}, {4, 8}); }),
              HasSubstr("block table: piece 1 begins at 3 and ends at 3"));
  EXPECT_THAT(error_of([] { ops::HostBlockTable({1, 8}, {4, 8}); }),
              HasSubstr("block table: the first piece must begin at 0"));
  EXPECT_THAT(error_of([] { ops::HostBlockTable({0, 8}, {0, 8}); }),
              HasSubstr("block table: block must be at least 1, not 0"));
}

TEST(CpuQuantize, BadArgumentsNameTheOpAndTheValue) {
  std::vector<float> x(4), out(4), scales(4);
  std::vector<int8_t> q(4);
  const ops::HostBlockTable four = one_piece(4, {4, 8});
  const ops::BlockTable table = four.host_table();
  const auto quantize_with = [&](QuantFormat f, const float* from, size_t n) {
    return error_of([&] { ops::quantize_blocks(Device::cpu, q.data(), scales.data(), from, n, f, table); });
  };
  EXPECT_THAT(quantize_with({0, 8}, x.data(), 4), HasSubstr("quantize_blocks: block must be at least 1, not 0"));
  EXPECT_THAT(quantize_with({-3, 8}, x.data(), 0), HasSubstr("quantize_blocks: block must be at least 1, not -3"));
  EXPECT_THAT(quantize_with({4, 2}, x.data(), 4), HasSubstr("quantize_blocks: bits must be 8 or 4, not 2"));
  EXPECT_THAT(quantize_with({4, 8}, nullptr, 3), HasSubstr("quantize_blocks: x is null for n = 3"));
  EXPECT_EQ(quantize_with({4, 8}, nullptr, 0), "(no error)");
  const auto dequantize_with = [&](QuantFormat f, const float* with_scales) {
    return error_of([&] { ops::dequantize_blocks(Device::cpu, out.data(), q.data(), with_scales, 4, f, table, true); });
  };
  EXPECT_THAT(dequantize_with({4, 8}, nullptr), HasSubstr("dequantize_blocks: scales is null for n = 4"));
  EXPECT_THAT(dequantize_with({4, 16}, scales.data()), HasSubstr("dequantize_blocks: bits must be 8 or 4, not 16"));
  EXPECT_THAT(error_of([&] { ops::quantized_size(4, {4, 5}); }),
              HasSubstr("quantized_size: bits must be 8 or 4, not 5"));
}

}  // namespace
}  // namespace zshard
