#include "kernels/io/safetensors.h"

#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "shard/weights_file.h"
#include "tests/support/test_support.h"

namespace zshard {
namespace {

using ::testing::HasSubstr;
using test::error_of;
using test::TempDir;

// Writes a file with a hand-made header (length field = header size unless `header_len` is given).
void write_raw(const std::string& path, const std::string& header, const std::string& data,
               uint64_t header_len = UINT64_MAX) {
  if (header_len == UINT64_MAX) header_len = header.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&header_len), 8);
  out << header << data;
}

// The bytes of an array, as a file stores them.
template <class T, size_t N>
std::string raw_bytes(const T (&values)[N]) {
  return std::string(reinterpret_cast<const char*>(values), sizeof values);
}

std::string open_error(const std::string& path) {
  return error_of([&] { SafetensorsFile::open(path); });
}

std::vector<uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> out;
  for (float f : v) out.push_back(std::bit_cast<uint32_t>(f));
  return out;
}

TEST(Safetensors, RoundTripIsBitExact) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  std::vector<float> special = {0.0f, -0.0f, 1.0f, -2.5f,
                                std::numeric_limits<float>::denorm_min(),
                                -std::numeric_limits<float>::denorm_min() * 37,
                                std::numeric_limits<float>::min(),
                                -std::numeric_limits<float>::min(),
                                std::bit_cast<float>(0x7f7ffffeu),   // just below max
                                -std::numeric_limits<float>::max(),
                                std::numeric_limits<float>::max(), 3.14159f};
  std::vector<float> odd(3 * 5 * 7);
  for (size_t i = 0; i < odd.size(); ++i) odd[i] = std::sin(float(i)) * 1e-3f;
  const float scalar = 42.5f, one = -7.0f;
  std::vector<SafetensorsArray> arrays = {{"special", special.data(), {12}},
                                          {"h.0.odd", odd.data(), {3, 5, 7}},
                                          {"scalar", &scalar, {}},
                                          {"one", &one, {1, 1}},
                                          {"empty", nullptr, {0, 4}}};
  save_safetensors(path, arrays, {{"format", "pt"}, {"step", "17"}});

  const auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"empty", "h.0.odd", "one", "scalar", "special"}));
  EXPECT_EQ(f.metadata(), (SafetensorsMetadata{{"format", "pt"}, {"step", "17"}}));
  EXPECT_EQ(f.entry("h.0.odd").dtype, "F32");
  EXPECT_EQ(f.entry("h.0.odd").shape, (Shape{3, 5, 7}));

  std::vector<float> got(12);
  f.read_f32("special", got.data(), {12});
  EXPECT_EQ(bits_of(got), bits_of(special));
  got.assign(odd.size(), 0);
  f.read_f32("h.0.odd", got.data(), {3, 5, 7});
  EXPECT_EQ(bits_of(got), bits_of(odd));
  float s = 0;
  f.read_f32("scalar", &s, {});
  EXPECT_EQ(s, scalar);
  f.read_f32("one", &s, {1, 1});
  EXPECT_EQ(s, one);
  f.read_f32("empty", nullptr, {0, 4});
  EXPECT_EQ(f.entry("empty").numel(), 0);
}

TEST(Safetensors, HeaderPaddedAndDataInOrder) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  const float a[3] = {1, 2, 3}, b[2] = {4, 5};
  save_safetensors(path, {{"zz", a, {3}}, {"aa", b, {2}}});
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
  std::string header(n, '\0');
  in.read(header.data(), std::streamsize(n));
  EXPECT_EQ(header.front(), '{');
  EXPECT_THAT(header, HasSubstr("\"data_offsets\":[0,12]"));  // zz first, as given
  EXPECT_THAT(header, HasSubstr("\"data_offsets\":[12,20]"));
  float data[5];
  in.read(reinterpret_cast<char*>(data), sizeof(data));
  EXPECT_EQ(data[0], 1);
  EXPECT_EQ(data[3], 4);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp." + std::to_string(::getpid())));
}

TEST(Safetensors, PartialReads) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  std::vector<float> v(6 * 10);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  const float other[2] = {-1, -2};
  save_safetensors(path, {{"first", other, {2}}, {"m", v.data(), {6, 10}}});
  const auto f = SafetensorsFile::open(path);
  std::vector<float> got(7);
  f.read_f32_range("m", 23, 7, got.data());
  EXPECT_EQ(got, (std::vector<float>{23, 24, 25, 26, 27, 28, 29}));
  f.read_f32_range("m", 59, 1, got.data());
  EXPECT_EQ(got[0], 59);
  f.read_f32_range("m", 60, 0, got.data());
  EXPECT_THAT(error_of([&] { f.read_f32_range("m", 55, 6, got.data()); }),
              HasSubstr("elements [55, 61) are outside tensor 'm' of 60 elements"));
}

TEST(Safetensors, ConvertsHalfBfloatAndDouble) {
  TempDir dir;
  const std::string path = dir.file("h.safetensors");
  const uint16_t f16[6] = {0x3C00, 0xC000, 0x0001, 0x7BFF, 0xFBFF, 0x8400};  // 1 -2 2^-24 65504 -65504 -2^-14
  const uint16_t bf16[2] = {0x3F80, 0xC0A0};                                  // 1 -5
  const double f64[2] = {0.25, -1e10};
  write_raw(path,
            R"({"a":{"dtype":"F16","shape":[2,3],"data_offsets":[0,12]},)"
            R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[12,16]},)"
            R"("c":{"dtype":"F64","shape":[2],"data_offsets":[16,32]},)"
            R"("i":{"dtype":"I64","shape":[],"data_offsets":[32,40]}})",
            raw_bytes(f16) + raw_bytes(bf16) + raw_bytes(f64) + std::string(8, '\0'));
  const auto f = SafetensorsFile::open(path);
  float got[6];
  f.read_f32("a", got, {2, 3});
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], -2.0f);
  EXPECT_EQ(got[2], std::ldexp(1.0f, -24));
  EXPECT_EQ(got[3], 65504.0f);
  EXPECT_EQ(got[4], -65504.0f);
  EXPECT_EQ(got[5], -std::ldexp(1.0f, -14));
  f.read_f32_range("a", 2, 1, got);
  EXPECT_EQ(got[0], std::ldexp(1.0f, -24));
  f.read_f32("b", got, {2});
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], -5.0f);
  f.read_f32("c", got, {2});
  EXPECT_EQ(got[0], 0.25f);
  EXPECT_EQ(got[1], -1e10f);
  EXPECT_THAT(error_of([&] { f.read_f32("i", got, {}); }),
              HasSubstr("tensor 'i' has dtype I64, which cannot be read as f32"));
}

TEST(Safetensors, MalformedFilesNameFileAndProblem) {
  TempDir dir;
  const std::string p = dir.file("bad.safetensors");
  const std::string ok_entry = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

  auto expect_open_error = [&](const std::string& problem) {
    const std::string msg = open_error(p);
    EXPECT_THAT(msg, HasSubstr(p));
    EXPECT_THAT(msg, HasSubstr(problem));
  };

  EXPECT_THAT(open_error(dir.file("missing.safetensors")),
              HasSubstr(dir.file("missing.safetensors") + ": cannot open (No such file"));

  std::ofstream(p, std::ios::binary) << "abc";
  expect_open_error("file is 3 bytes, shorter than the 8-byte header length");

  write_raw(p, ok_entry, std::string(8, '\0'), 1000);
  expect_open_error("header length 1000 exceeds");

  write_raw(p, R"({"x": {"dtype": )", "");
  expect_open_error("bad JSON header");
  write_raw(p, "[1, 2]", "");
  expect_open_error("bad JSON header (not an object)");

  write_raw(p, R"({"x":{"shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0'));
  expect_open_error("entry 'x' has no dtype");
  write_raw(p, R"({"x":{"dtype":"F32","data_offsets":[0,8]}})", std::string(8, '\0'));
  expect_open_error("entry 'x' has no shape");
  write_raw(p, R"({"x":{"dtype":"F32","shape":[2]}})", std::string(8, '\0'));
  expect_open_error("entry 'x' has no data_offsets");
  write_raw(p, R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, '\0'));
  expect_open_error("shape [-2] is not a list of non-negative integers");
  write_raw(p, R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", std::string(8, '\0'));
  expect_open_error("data_offsets [8,0] is not a pair [begin, end] with begin <= end");

  write_raw(p, R"({"x":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0'));
  expect_open_error("entry 'x' has unknown dtype 'Q4'");

  write_raw(p, R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(12, '\0'));
  expect_open_error("entry 'x': data_offsets [0,8] span 8 bytes but shape (3) of F32 needs 12");

  write_raw(p, ok_entry, std::string(5, '\0'));
  expect_open_error("truncated: tensor 'x' ends at data byte 8 but the file holds 5 data bytes");

  write_raw(p, R"({"__metadata__":{"a":1}})", "");
  expect_open_error("__metadata__ value of 'a' is not a string");

  // The tensors tile the data exactly, as the format requires: no overlap, no byte of nobody's.
  write_raw(p, R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            std::string(8, '\0'));
  expect_open_error("tensor 'y' starts at data byte 4, inside the tensor before it");
  write_raw(p, R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", std::string(8, '\0'));
  expect_open_error("data bytes 0 to 4 belong to no tensor");
  write_raw(p, ok_entry, std::string(12, '\0'));
  expect_open_error("data bytes 8 to 12 belong to no tensor");
}

TEST(Safetensors, MissingTensorAndShapeMismatch) {
  TempDir dir;
  const std::string p = dir.file("w.safetensors");
  const float v[6] = {};
  save_safetensors(p, {{"w", v, {2, 3}}});
  const auto f = SafetensorsFile::open(p);
  float got[6];
  std::string msg = error_of([&] { f.read_f32("nope", got, {2, 3}); });
  EXPECT_THAT(msg, HasSubstr(p));
  EXPECT_THAT(msg, HasSubstr("no tensor named 'nope'"));
  msg = error_of([&] { f.read_f32("w", got, {3, 2}); });
  EXPECT_THAT(msg, HasSubstr(p));
  EXPECT_THAT(msg, HasSubstr("tensor 'w' has shape (2, 3), expected (3, 2)"));
}

TEST(Safetensors, SaveRejectsBadInput) {
  TempDir dir;
  const std::string p = dir.file("w.safetensors");
  const float v[2] = {};
  EXPECT_THAT(error_of([&] { save_safetensors(p, {{"a", v, {2}}, {"a", v, {2}}}); }),
              HasSubstr("tensor 'a' given twice"));
  EXPECT_THAT(error_of([&] { save_safetensors(p, {{"__metadata__", v, {2}}}); }),
              HasSubstr("cannot save a tensor named '__metadata__'"));
  EXPECT_THAT(error_of([&] { save_safetensors(dir.file("no/such/dir/w.safetensors"), {}); }),
              HasSubstr("no/such/dir/w.safetensors: cannot write (No such file or directory)"));
  const float nan[3] = {1, std::numeric_limits<float>::quiet_NaN(), 2};
  EXPECT_THAT(error_of([&] { save_safetensors(p, {{"w", nan, {3}}}); }),
              HasSubstr("tensor 'w' holds a non-finite value (nan at element 1)"));
  EXPECT_FALSE(std::filesystem::exists(p));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "no temporary file is left behind";
}

// NaN and inf mean a diverged run: the reader refuses them in every dtype, naming tensor and element.
TEST(Safetensors, ReadRejectsNonFiniteValues) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  const float f32[3] = {1, 2, -std::numeric_limits<float>::infinity()};
  const uint16_t f16[2] = {0x3C00, 0x7E00};                        // 1, NaN
  const double f64[2] = {1e300, 0};                                // overflows f32
  write_raw(path,
            R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
            R"("b":{"dtype":"F16","shape":[2],"data_offsets":[12,16]},)"
            R"("c":{"dtype":"F64","shape":[2],"data_offsets":[16,32]}})",
            raw_bytes(f32) + raw_bytes(f16) + raw_bytes(f64));
  const auto f = SafetensorsFile::open(path);
  float got[3];
  EXPECT_THAT(error_of([&] { f.read_f32("a", got, {3}); }),
              HasSubstr("tensor 'a' holds a non-finite value (-inf at element 2)"));
  f.read_f32_range("a", 0, 2, got);  // the finite part reads
  EXPECT_EQ(got[1], 2.0f);
  EXPECT_THAT(error_of([&] { f.read_f32("b", got, {2}); }),
              HasSubstr("tensor 'b' holds a non-finite value (nan at element 1)"));
  EXPECT_THAT(error_of([&] { f.read_f32("c", got, {2}); }),
              HasSubstr("tensor 'c' holds a non-finite value (inf at element 0)"));
}

TEST(Gpt2Weights, ResolvesPrefixAndFindsExtraTensors) {
  TempDir dir;
  const std::string p = dir.file("hf.safetensors");
  const float v[4] = {1, 2, 3, 4};
  save_safetensors(p, {{"transformer.wte.weight", v, {2, 2}},
                       {"wpe.weight", v, {2, 2}},
                       {"transformer.h.0.attn.bias", v, {1, 1, 2, 2}},
                       {"transformer.h.0.attn.masked_bias", v, {}},
                       {"lm_head.weight", v, {2, 2}},
                       {"transformer.h.0.attn.c_attn.bias", v, {4}},
                       {"transformer.h.1.ln_1.weight", v, {2}}});
  const auto f = SafetensorsFile::open(p);
  EXPECT_EQ(resolve_name(f, "wte.weight"), "transformer.wte.weight");
  EXPECT_EQ(resolve_name(f, "wpe.weight"), "wpe.weight");
  const std::string msg = error_of([&] { resolve_name(f, "ln_f.weight"); });
  EXPECT_THAT(msg, HasSubstr(p));
  EXPECT_THAT(msg, HasSubstr("no tensor named 'ln_f.weight' (nor with a transformer. or model. prefix)"));

  const std::vector<std::string> expected = {"wte.weight", "wpe.weight", "h.0.attn.c_attn.bias"};
  EXPECT_EQ(unmatched_tensors(f, expected), (std::vector<std::string>{"transformer.h.1.ln_1.weight"}));
}

}  // namespace
}  // namespace zshard
