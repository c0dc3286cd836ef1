
#include <zshard/error.h>

#include "runtime/train/data.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>

#include "tests/support/test_support.h"

namespace zshard {
namespace {

using ::testing::HasSubstr;
using test::error_of;
using test::TempDir;

std::vector<int32_t> all_tokens(const TokenDataset& d) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < d.size(); ++i) out.push_back(d.token(i));
  return out;
}

// An llm.c token file with the given header fields and tokens.
void write_llmc(const std::string& path, const std::vector<uint16_t>& tokens, int32_t magic = kLlmcMagic,
                int32_t version = kLlmcVersion, int32_t count = -1) {
  int32_t header[kLlmcHeaderInts] = {};
  header[0] = magic;
  header[1] = version;
  header[2] = count >= 0 ? count : int32_t(tokens.size());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header), sizeof(header));
  out.write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * 2));
}

TokenDataset iota_dataset(int n) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), 0);
  return TokenDataset::from_tokens(std::move(t), "test tokens");
}

TEST(Data, SequenceIndexingAndWrapAround) {
  // 50 tokens 0..49; B = 4, T = 5: sequence k of micro-step s starts at (s*4 + k)*5 mod 50.
  const TokenDataset d = iota_dataset(50);
  std::vector<int32_t> in(4 * 5), tg(4 * 5);
  d.fill_batch(0, 4, 5, 0, 4, in.data(), tg.data());
  EXPECT_EQ(in, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}));
  EXPECT_EQ(tg, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}));

  // Step 2, sequences [1, 3): starts 45 and 50 % 50 = 0; the first wraps inside its targets.
  d.fill_batch(2, 4, 5, 1, 2, in.data(), tg.data());
  EXPECT_EQ(std::vector<int32_t>(in.begin(), in.begin() + 10),
            (std::vector<int32_t>{45, 46, 47, 48, 49, 0, 1, 2, 3, 4}));
  EXPECT_EQ(std::vector<int32_t>(tg.begin(), tg.begin() + 10),
            (std::vector<int32_t>{46, 47, 48, 49, 0, 1, 2, 3, 4, 5}));

  // 47 tokens, B = 2, T = 6, step 3, sequence 1: start (3*2 + 1)*6 = 42; inputs 42..46, 0.
  const TokenDataset e = iota_dataset(47);
  d.fill_batch(0, 1, 1, 0, 0, nullptr, nullptr);  // an empty slice is fine
  e.fill_batch(3, 2, 6, 1, 1, in.data(), tg.data());
  EXPECT_EQ(std::vector<int32_t>(in.begin(), in.begin() + 6), (std::vector<int32_t>{42, 43, 44, 45, 46, 0}));
  EXPECT_EQ(std::vector<int32_t>(tg.begin(), tg.begin() + 6), (std::vector<int32_t>{43, 44, 45, 46, 0, 1}));

  // Huge step counts reduce correctly: (s*B + k)*T mod n computed without overflow.
  const int64_t s = 4'000'000'000'000LL;
  e.fill_batch(s, 2, 6, 0, 1, in.data(), tg.data());
  const int64_t start = int64_t((__int128(s) * 2 * 6) % 47);
  EXPECT_EQ(in[0], start);
}

TEST(Data, SlicesOfTheGlobalBatchAgree) {
  const TokenDataset d = iota_dataset(97);
  const int B = 6, T = 8;
  std::vector<int32_t> all_in(B * T), all_tg(B * T), in(B * T), tg(B * T);
  d.fill_batch(5, B, T, 0, B, all_in.data(), all_tg.data());
  for (auto [k0, b] : {std::pair{0, 2}, {2, 3}, {5, 1}}) {
    d.fill_batch(5, B, T, k0, b, in.data(), tg.data());
    EXPECT_TRUE(std::equal(in.begin(), in.begin() + b * T, all_in.begin() + k0 * T));
    EXPECT_TRUE(std::equal(tg.begin(), tg.begin() + b * T, all_tg.begin() + k0 * T));
  }
  EXPECT_THAT(error_of([&] { d.fill_batch(0, B, T, 4, 3, in.data(), tg.data()); }),
              HasSubstr("bad batch slice"));
}

TEST(Data, SequenceLongerThanDataIsAnError) {
  const TokenDataset d = iota_dataset(8);
  d.check_seq_len(7);
  const std::string msg = error_of([&] { d.check_seq_len(8); });
  EXPECT_THAT(msg, HasSubstr("data test tokens: has 8 tokens, fewer than the 9 needed"));
  std::vector<int32_t> buf(8);
  EXPECT_THAT(error_of([&] { d.fill_batch(0, 1, 8, 0, 1, buf.data(), buf.data()); }),
              HasSubstr("fewer than the 9 needed"));
}

TEST(Data, LlmcRoundTrip) {
  TempDir dir;
  const std::string path = dir.file("train.bin");
  const std::vector<uint16_t> tokens = {50256, 0, 17, 65535, 300, 2};
  write_llmc(path, tokens);
  for (const TokenDataset& d : {TokenDataset::from_llmc_file(path), TokenDataset::load(path)}) {
    EXPECT_EQ(all_tokens(d), (std::vector<int32_t>{50256, 0, 17, 65535, 300, 2}));
    EXPECT_EQ(d.source(), "file " + path);
  }
  // Detected by its magic whatever the name.
  const std::string other = dir.file("tokens.dat");
  write_llmc(other, {1, 2, 3});
  EXPECT_EQ(all_tokens(TokenDataset::load(other)), (std::vector<int32_t>{1, 2, 3}));

  const std::string msg = error_of([&] { TokenDataset::load(path).check_vocab(50257); });
  EXPECT_THAT(msg, HasSubstr("data file " + path + ": token 65535 at position 3 is outside the model's "
                             "vocabulary of 50257"));
  TokenDataset::load(path).check_vocab(65536);
  // A copy keeps the file's mapping: it reads the tokens after the dataset it was made from is gone, and
  // after the file itself is.
  std::optional<TokenDataset> copy;
  {
    const TokenDataset d = TokenDataset::load(path);
    copy = d;
  }
  std::filesystem::remove(path);
  EXPECT_EQ(all_tokens(*copy), (std::vector<int32_t>{50256, 0, 17, 65535, 300, 2}));
}

TEST(Data, MalformedLlmcFiles) {
  TempDir dir;
  const std::string p = dir.file("bad.bin");
  auto expect_error = [&](const std::string& problem) {
    const std::string msg = error_of([&] { TokenDataset::load(p); });
    EXPECT_THAT(msg, HasSubstr("data file " + p + ": "));
    EXPECT_THAT(msg, HasSubstr(problem));
  };
  EXPECT_EQ(error_of([&] { TokenDataset::load(p); }), "--data " + p + ": no such file");
  write_llmc(p, {1, 2, 3}, 12345);
  expect_error("bad magic 12345");
  write_llmc(p, {1, 2, 3}, kLlmcMagic, 2);
  expect_error("unsupported llm.c token file version 2 (expected 1)");
  write_llmc(p, {1, 2, 3}, kLlmcMagic, kLlmcVersion, 10);
  expect_error("truncated: the header says 10 tokens but the file holds 3");
  // Tokens past the count, as llm.c's loader refuses them: another file's header, or two files joined.
  write_llmc(p, {1, 2, 3, 4}, kLlmcMagic, kLlmcVersion, 3);
  expect_error("the header says 3 tokens (1030 bytes with the header) but the file has 1032 bytes");
  std::ofstream(p, std::ios::binary) << "short";
  expect_error("shorter than its 1024-byte header");
  write_llmc(p, {});
  EXPECT_THAT(error_of([&] { TokenDataset::load(p).check_seq_len(4); }),
              HasSubstr("data file " + p + ": has 0 tokens, fewer than the 5 needed"));
}

TEST(Data, TextFileIsBytes) {
  TempDir dir;
  const std::string p = dir.file("notes.txt");
  std::ofstream(p, std::ios::binary) << "Hi\n\xff\x01";
  const TokenDataset d = TokenDataset::load(p);
  EXPECT_EQ(all_tokens(d), (std::vector<int32_t>{'H', 'i', '\n', 255, 1}));
  d.check_vocab(256);
  EXPECT_THAT(error_of([&] { d.check_vocab(128); }),
              HasSubstr("data file " + p + ": token 255 at position 3 is outside the model's vocabulary of 128"));
  const std::string empty = dir.file("empty.txt");
  std::ofstream(empty, std::ios::binary).flush();
  EXPECT_THAT(error_of([&] { TokenDataset::load(empty); }), HasSubstr("data file " + empty + ": is empty"));
}

// Data is read whole: a FIFO would block the open until a writer came (every rank, before any collective,
// so no deadline ends it), and /dev/zero would be read until memory ran out. Both are refused at once.
TEST(Data, NotARegularFileIsRefused) {
  TempDir dir;
  const std::string fifo = dir.file("pipe");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(error_of([&] { TokenDataset::load(fifo, "--eval-data"); }),
              HasSubstr("--eval-data " + fifo + ": is a FIFO (named pipe)"));
  EXPECT_THAT(error_of([&] { TokenDataset::from_text_file(fifo); }), HasSubstr("--data " + fifo + ": is a FIFO"));
  EXPECT_THAT(error_of([&] { TokenDataset::load("/dev/zero"); }), HasSubstr("--data /dev/zero: is a character device"));
  EXPECT_THROW(TokenDataset::load("/dev/zero"), UsageError);
}

TEST(Data, EmbeddedCorpusIsSubstantialAscii) {
  ASSERT_GT(kDefaultCorpusSize, 20000u);
  const TokenDataset d = TokenDataset::load("default");
  EXPECT_EQ(d.size(), int64_t(kDefaultCorpusSize));
  d.check_vocab(128);  // plain ASCII
  int letters = 0, spaces = 0;
  for (int32_t t : all_tokens(d)) {
    EXPECT_TRUE(t == '\n' || (t >= 32 && t < 127)) << "byte " << t;
    letters += std::isalpha(t) != 0;
    spaces += t == ' ';
  }
  EXPECT_GT(letters, d.size() * 7 / 10);  // prose, not a placeholder
  EXPECT_GT(spaces, d.size() / 10);
}

}  // namespace
}  // namespace zshard
