// Fuzzes TokenDataset::load on mutated llm.c token files (256 x int32 header: magic 20240520, version 1,
// token count; then uint16 tokens), under a ".bin" name and under a name without one (where the magic
// decides between token file and text), then check_vocab, check_seq_len and fill_batch on what loads.
#include <climits>
#include <cstring>

#include "runtime/train/data.h"
#include "tests/fuzz/fuzz_support.h"

namespace zshard::fuzz {

namespace {

constexpr size_t kHeaderBytes = kLlmcHeaderInts * sizeof(int32_t);

Bytes token_file(int32_t magic, int32_t version, int32_t count, const std::vector<uint16_t>& tokens) {
  int32_t header[kLlmcHeaderInts] = {magic, version, count};
  Bytes file(reinterpret_cast<const char*>(header), kHeaderBytes);
  file.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint16_t));
  return file;
}

std::vector<Bytes> prepare_llmc_tokens(const std::string&) {
  std::vector<uint16_t> gpt2_tokens(300), full_range(64);
  for (size_t i = 0; i < gpt2_tokens.size(); ++i) gpt2_tokens[i] = uint16_t(i * 7919 % 50257);
  for (size_t i = 0; i < full_range.size(); ++i) full_range[i] = uint16_t(65535 - i * 1024);
  return {token_file(kLlmcMagic, kLlmcVersion, 300, gpt2_tokens),
          token_file(kLlmcMagic, kLlmcVersion, 0, {}),
          token_file(kLlmcMagic, kLlmcVersion, 2, {7, 8}),
          token_file(kLlmcMagic, kLlmcVersion, 64, full_range)};
}

// The three header fields a reader trusts, each set to a value around what the file holds.
void mutate_header_field(Bytes& input, Rng& rng) {
  if (input.size() < 3 * sizeof(int32_t)) return;
  const int64_t held = input.size() < kHeaderBytes ? 0 : int64_t((input.size() - kHeaderBytes) / 2);
  const int64_t choices[] = {kLlmcMagic, kLlmcVersion, 0, 2, -1, INT32_MAX, INT32_MIN, held, held + 1,
                             held - 1, int64_t(rng.pick(interesting_integers()))};
  const int32_t value = int32_t(rng.pick(choices));
  std::memcpy(input.data() + rng.below(3) * sizeof(int32_t), &value, sizeof value);
}

// Cuts around the header's end and the token pairs, where the size arithmetic has its edges.
void truncate_at_edge(Bytes& input, Rng& rng) {
  const size_t cuts[] = {0, 3, 4, kHeaderBytes - 1, kHeaderBytes, kHeaderBytes + 1, input.size() - 1,
                         input.size() / 2};
  const size_t cut = rng.pick(cuts);
  if (cut < input.size()) input.resize(cut);
}

void mutate_llmc_tokens(Bytes& input, Rng& rng) {
  switch (rng.below(6)) {
    case 0:
    case 1: mutate_header_field(input, rng); return;
    case 2: truncate_at_edge(input, rng); return;
    default: mutate_bytes(input, rng); return;
  }
}

// What training does with a loaded stream: vocabulary and length checks, then batches at the first,
// an ordinary and the largest step (the wrap-around arithmetic must not overflow).
void use_dataset(const TokenDataset& data) {
  for (int vocab : {1, 256, 50257, 65536}) attempt("check_vocab", [&] { data.check_vocab(vocab); });
  const int64_t n = data.size();
  for (int64_t T : {int64_t(0), int64_t(1), n - 1, n, n + 1})
    if (T <= INT_MAX) attempt("check_seq_len", [&] { data.check_seq_len(int(T)); });
  if (n > INT_MAX) return;
  expect_error("fill_batch longer than the stream", [&] {
    int32_t unused[1];
    data.fill_batch(0, 1, int(n), 0, 0, unused, unused);
  });
  if (n < 2) return;
  const int T = int(std::min<int64_t>(n - 1, 33)), B = 3;
  std::vector<int32_t> inputs(size_t(B) * T), targets(size_t(B) * T);
  for (int64_t step : {int64_t(0), int64_t(5), int64_t(INT64_MAX)}) {
    // A stream of n >= T + 1 tokens serves any step and any slice: failing here is a bug, not a rejection.
    if (!attempt("fill_batch", [&] { data.fill_batch(step, B, T, 0, B, inputs.data(), targets.data()); }) ||
        !attempt("fill_batch", [&] { data.fill_batch(step, B, T, 1, 2, inputs.data(), targets.data()); }))
      throw BadOutcome{"fill_batch failed on a stream of " + std::to_string(n) + " tokens"};
  }
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i] < 0 || inputs[i] > 65535 || targets[i] < 0 || targets[i] > 65535)
      throw BadOutcome{"fill_batch produced token " + std::to_string(inputs[i]) + " outside uint16"};
}

bool exercise_llmc_tokens(const Bytes& input, const std::string& workdir) {
  // Without the ".bin" suffix the first int32 decides: magic means token file, anything else is text.
  const std::string sniffed_path = workdir + "/tokens";
  write_file(sniffed_path, input);
  attempt("TokenDataset::load", [&] { use_dataset(TokenDataset::load(sniffed_path)); });
  const std::string path = workdir + "/tokens.bin";
  write_file(path, input);
  const TokenDataset data = TokenDataset::load(path);
  if (data.size() < 0 || uint64_t(data.size()) > input.size() / 2)
    throw BadOutcome{"loaded " + std::to_string(data.size()) + " tokens from " +
                     std::to_string(input.size()) + " bytes"};
  use_dataset(data);
  return true;
}

}  // namespace

const ParserTarget& llmc_tokens_target() {
  static const ParserTarget target{"llmc_tokens", prepare_llmc_tokens, mutate_llmc_tokens,
                                    exercise_llmc_tokens};
  return target;
}

}  // namespace zshard::fuzz
