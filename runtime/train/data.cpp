#include "runtime/train/data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <span>

#include <zshard/error.h>

#include "kernels/io/atomic_file.h"
#include "runtime/cli/path_checks.h"

namespace zshard {

namespace {

// `flag` is the option that named the data (--data, --eval-data). What the data holds is a bad value of the
// flag (exit 2: zshard-run relaunches nothing, the same data failing the same way); a read that fails is not.
template <class... Args>
[[noreturn]] void refuse_data(std::string_view flag, const std::string& source, const Args&... args) {
  refuse(flag, " ", source, ": ", args...);
}
template <class... Args>
[[noreturn]] void fail_read(std::string_view flag, const std::string& source, const Args&... args) {
  fail(flag, " ", source, ": ", args...);
}

std::string file_source(const std::string& path) { return "file " + path; }

// Data is mapped whole: a regular file, or a bad flag value.
constexpr std::string_view kDataFile = "a token or text file";

struct MappedFile {
  std::shared_ptr<const void> mapping;  // unmapped when the last dataset holding it goes
  const uint8_t* bytes = nullptr;
  size_t size = 0;
};

MappedFile map_file(const std::string& path, std::string_view flag) {
  check_input_file(flag, path, kDataFile);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_read(flag, file_source(path), "cannot open (", std::strerror(errno), ")");
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    fail_read(flag, file_source(path), "cannot stat (", std::strerror(error), ")");
  }
  MappedFile f;
  f.size = size_t(st.st_size);
  if (f.size == 0) {
    ::close(fd);
    return f;
  }
  void* p = ::mmap(nullptr, f.size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int error = errno;
  ::close(fd);  // the mapping keeps the file
  if (p == MAP_FAILED) fail_read(flag, file_source(path), "cannot map (", std::strerror(error), ")");
  const size_t size = f.size;
  f.mapping = std::shared_ptr<const void>(p, [size](const void* q) { ::munmap(const_cast<void*>(q), size); });
  f.bytes = static_cast<const uint8_t*>(p);
  return f;
}

bool ends_with_bin(const std::string& path) {
  return path.size() >= 4 && path.compare(path.size() - 4, 4, ".bin") == 0;
}

}  // namespace

void TokenDataset::check_source(const std::string& spec, std::string_view flag) {
  if (spec != "default") check_input_file(flag, spec, kDataFile);
}

TokenDataset TokenDataset::load(const std::string& spec, std::string_view flag) {
  if (spec == "default") return from_default_corpus(flag);
  check_source(spec, flag);  // before the peek below: opening a FIFO would block
  int32_t first = 0;
  {
    std::ifstream in(spec, std::ios::binary);
    if (!in) fail_read(flag, file_source(spec), "cannot open (", std::strerror(errno), ")");
    in.read(reinterpret_cast<char*>(&first), sizeof(first));
  }
  // A ".bin" without the magic is a damaged token file, not text: report it instead of training on it.
  if (first == kLlmcMagic || ends_with_bin(spec)) return from_llmc_file(spec, flag);
  return from_text_file(spec, flag);
}

TokenDataset TokenDataset::from_default_corpus(std::string_view flag) {
  return {nullptr, kDefaultCorpus, 1, int64_t(kDefaultCorpusSize), "default (embedded corpus)", flag};
}

TokenDataset TokenDataset::from_text_file(const std::string& path, std::string_view flag) {
  MappedFile file = map_file(path, flag);
  if (file.size == 0) refuse_data(flag, file_source(path), "is empty");
  return {std::move(file.mapping), file.bytes, 1, int64_t(file.size), file_source(path), flag};
}

TokenDataset TokenDataset::from_llmc_file(const std::string& path, std::string_view flag) {
  const std::string source = file_source(path);
  MappedFile file = map_file(path, flag);
  const std::span<const uint8_t> bytes(file.bytes, file.size);
  constexpr size_t kHeaderBytes = kLlmcHeaderInts * sizeof(int32_t);
  if (bytes.size() < kHeaderBytes)
    refuse_data(flag, source, "llm.c token file of ", bytes.size(), " bytes is shorter than its ", kHeaderBytes,
              "-byte header");
  int32_t header[kLlmcHeaderInts];
  std::memcpy(header, bytes.data(), kHeaderBytes);
  if (header[0] != kLlmcMagic)
    refuse_data(flag, source, "bad magic ", header[0], " (an llm.c token file starts with ", kLlmcMagic, ")");
  if (header[1] != kLlmcVersion)
    refuse_data(flag, source, "unsupported llm.c token file version ", header[1], " (expected ", kLlmcVersion, ")");
  const int64_t count = header[2];
  const int64_t held = int64_t((bytes.size() - kHeaderBytes) / sizeof(uint16_t));
  if (count < 0) refuse_data(flag, source, "negative token count ", count, " in the header");
  if (count > held)
    refuse_data(flag, source, "truncated: the header says ", count, " tokens but the file holds ", held);
  // Bytes past the counted tokens (as llm.c's own loader refuses them): a header from another file, or two
  // files joined, would otherwise train on a part of the data without a word.
  if (const size_t expected = kHeaderBytes + size_t(count) * sizeof(uint16_t); bytes.size() != expected)
    refuse_data(flag, source, "the header says ", count, " tokens (", expected, " bytes with the header) but the file has ",
                bytes.size(), " bytes");
  return {std::move(file.mapping), bytes.data() + kHeaderBytes, 2, count, source, flag};
}

TokenDataset TokenDataset::from_tokens(std::vector<int32_t> tokens, std::string source, std::string_view flag) {
  const auto owned = std::make_shared<const std::vector<int32_t>>(std::move(tokens));
  return {owned, reinterpret_cast<const uint8_t*>(owned->data()), 4, int64_t(owned->size()), std::move(source), flag};
}

int32_t TokenDataset::token(int64_t i) const {
  switch (width_) {
    case 1: return data_[i];
    case 2: {
      uint16_t t;  // little-endian on disk, as on every host zshard builds for
      std::memcpy(&t, data_ + size_t(i) * 2, sizeof t);
      return t;
    }
    default: {
      int32_t t;
      std::memcpy(&t, data_ + size_t(i) * 4, sizeof t);
      return t;
    }
  }
}

void TokenDataset::check_vocab(int vocab) const {
  if (width_ == 1 && vocab >= kByteVocab) return;  // bytes
  for (int64_t i = 0; i < size_; ++i)
    if (const int32_t t = token(i); t < 0 || t >= vocab)
      refuse_data(flag_, source_, "token ", t, " at position ", i, " is outside the model's vocabulary of ", vocab,
                  " (ids 0..", vocab - 1, ")");
}

void TokenDataset::check_seq_len(int T) const {
  if (T < 1) refuse_data(flag_, source_, "sequence length must be positive, got ", T);
  if (size() < int64_t(T) + 1)
    refuse_data(flag_, source_, "has ", size(), " tokens, fewer than the ", int64_t(T) + 1,
              " needed for one sequence of ", T, " plus its target");
}

void TokenDataset::check_holds(int64_t sequences, int T, const std::string& reader) const {
  const int64_t needed = sequences * T + 1;
  if (size() < needed)
    refuse(flag_, " ", source_, ": has ", size(), " tokens, fewer than the ", needed, " that ", reader,
           " reads; it would read some twice");
}

void TokenDataset::fill_batch(int64_t micro_step, int B, int T, int k0, int b, int32_t* inputs,
                              int32_t* targets) const {
  check_seq_len(T);
  ZS_CHECK(micro_step >= 0 && B > 0 && k0 >= 0 && b >= 0 && k0 + int64_t(b) <= B,
           "bad batch slice: step ", micro_step, ", sequences [", k0, ", ", k0 + b, ") of ", B);
  // Reduce before multiplying so (s*B + k)*T cannot overflow for any step count.
  const uint64_t n = uint64_t(size());
  for (int k = 0; k < b; ++k) {
    const uint64_t seq = (uint64_t(micro_step) % n * (uint64_t(B) % n) + uint64_t(k0 + k)) % n;
    const uint64_t start = seq * (uint64_t(T) % n) % n;
    for (int j = 0; j < T; ++j) {
      inputs[size_t(k) * T + j] = token(int64_t((start + j) % n));
      targets[size_t(k) * T + j] = token(int64_t((start + j + 1) % n));
    }
  }
}

}  // namespace zshard
