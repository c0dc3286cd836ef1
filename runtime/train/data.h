// Token datasets: the token stream from the embedded default corpus (bytes), a text file (bytes) or an
// llm.c token file (256 int32 header: magic 20240520, version 1, token count; then uint16 tokens). A file
// is mapped read-only, not read into memory: its pages are the page cache's, shared by the ranks of a host
// and read where a batch reads them (an eval set's first batches alone), rather than a copy of the whole
// stream, 4 bytes a token, in every rank's memory, which the memory report would not see.
//
// The batch of a step is global and fixed whatever the world size: sequence k of global micro-step s
// starts at token (s*B + k)*T, wrapping around the end of the stream, and a rank fills a contiguous
// slice of the B sequences.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace zshard {

// The default corpus compiled into the library (generated from models/data/default_corpus.txt).
extern const uint8_t kDefaultCorpus[];
extern const size_t kDefaultCorpusSize;

constexpr int kByteVocab = 256;  // what a text file's bytes need of a model's vocabulary
constexpr int32_t kLlmcMagic = 20240520;
constexpr int32_t kLlmcVersion = 1;
constexpr int kLlmcHeaderInts = 256;

class TokenDataset {
 public:
  // `spec` is "default" (the embedded corpus), an llm.c token file (first int32 is the magic, or the
  // name ends in ".bin") or any other file, read as bytes. Errors name `flag`, the option that gave it.
  static TokenDataset load(const std::string& spec, std::string_view flag = "--data");
  // What load checks before it reads: a spec that names no file of a kind it reads is refused (UsageError).
  static void check_source(const std::string& spec, std::string_view flag = "--data");
  static TokenDataset from_default_corpus(std::string_view flag = "--data");
  static TokenDataset from_text_file(const std::string& path, std::string_view flag = "--data");
  static TokenDataset from_llmc_file(const std::string& path, std::string_view flag = "--data");
  static TokenDataset from_tokens(std::vector<int32_t> tokens, std::string source, std::string_view flag = "--data");

  int64_t size() const { return size_; }
  int32_t token(int64_t i) const;  // 0 <= i < size()
  const std::string& source() const { return source_; }

  // Errors naming the data source when a token id is >= `vocab` (the model's vocabulary) ...
  void check_vocab(int vocab) const;
  // ... or when the stream is shorter than the T + 1 tokens one sequence with its targets needs.
  void check_seq_len(int T) const;
  // UsageError when the stream is shorter than `sequences` sequences of T tokens one after the other, with
  // the last one's target: what `reader` (a flag and its value) reads, each token once.
  void check_holds(int64_t sequences, int T, const std::string& reader) const;

  // Fills sequences [k0, k0 + b) of the B sequences of global micro-step `micro_step`: b*T inputs and
  // b*T targets (the next token of each input), row-major.
  void fill_batch(int64_t micro_step, int B, int T, int k0, int b, int32_t* inputs,
                  int32_t* targets) const;

  TokenDataset() = default;  // empty: no tokens (a trainer's --eval-data when it has none)

 private:
  TokenDataset(std::shared_ptr<const void> storage, const uint8_t* data, int width, int64_t size, std::string source,
               std::string_view flag)
      : storage_(std::move(storage)), data_(data), width_(width), size_(size), source_(std::move(source)), flag_(flag) {}

  // The tokens where they lie, width_ bytes each (1: text, 2: llm.c, 4: from_tokens' int32), from data_:
  // in a file mapping that storage_ keeps alive, in the embedded corpus, or in storage_'s own vector.
  std::shared_ptr<const void> storage_;
  const uint8_t* data_ = nullptr;
  int width_ = 4;
  int64_t size_ = 0;
  std::string source_;
  std::string flag_ = "--data";
};

}  // namespace zshard
