#include "kernels/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <tuple>
#include <vector>
#include <nlohmann/json.hpp>

#include "kernels/io/atomic_file.h"
#include "kernels/io/checksum.h"
#include "kernels/io/file_json.h"

namespace zshard {

// The format is little-endian; data is copied straight into host floats.
static_assert(std::endian::native == std::endian::little, "zshard assumes a little-endian host");

namespace {

using nlohmann::json;

template <class... Args>
[[noreturn]] void fail_file(const std::string& path, const Args&... args) {
  fail("safetensors file ", path, ": ", args...);
}

// Element sizes of the safetensors dtypes. Non-float dtypes are accepted in a file (checkpoints may
// carry integer buffers) but cannot be read as f32.
size_t dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, size_t> kSizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},   {"U64", 8},     {"U32", 4},
      {"U16", 2}, {"U8", 1},  {"BOOL", 1}};
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24 is exact in f32
    const float mag = std::ldexp(float(mant), -24);
    return std::bit_cast<float>(std::bit_cast<uint32_t>(mag) | sign);
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // inf, NaN payload
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

// An open file descriptor, closed on scope exit.
class Fd {
 public:
  Fd(const std::string& path, int flags, mode_t mode = 0) : fd_(::open(path.c_str(), flags, mode)) {}
  ~Fd() { close(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int close() {
    int rc = fd_ >= 0 ? ::close(fd_) : 0;
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

// Reads exactly `n` bytes at `offset`; false on a short read or an error.
bool pread_all(int fd, void* dst, size_t n, uint64_t offset) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t got = ::pread(fd, p, n, off_t(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= size_t(got);
    offset += uint64_t(got);
  }
  return true;
}

// Whether no value has an exponent of all ones (inf or NaN). Written without an early exit so that the
// compiler vectorises it: checkpoints scan gigabytes, and the search for the culprit runs only on failure.
bool all_finite(const float* values, int64_t count) {
  uint32_t non_finite = 0;
  for (int64_t i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, values + i, sizeof bits);
    non_finite |= uint32_t((bits & 0x7f800000u) == 0x7f800000u);
  }
  return non_finite == 0;
}

// zshard neither loads nor saves NaN or inf: such weights or optimizer state mean a diverged run, and
// training on from them only spreads the damage.
void check_finite(const std::string& path, const std::string& name, const float* values, int64_t count,
                  int64_t first_index) {
  if (all_finite(values, count)) return;
  for (int64_t i = 0; i < count; ++i)
    if (!std::isfinite(values[i]))
      fail_file(path, "tensor '", name, "' holds a non-finite value (", values[i], " at element ",
                first_index + i, ")");
}

// Names and keys from a file end up in one-line error messages: a control character would break the line.
void check_printable(const std::string& path, const char* what, const std::string& text) {
  if (has_control_character(text)) fail_file(path, what, " ", json(text).dump(), " holds a control character");
}

// A header nests three levels (tensor, field, list); anything deeper is refused before it is used.
constexpr int kMaxHeaderDepth = 16;

SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const json& j) {
  if (!j.is_object()) fail_file(path, "entry '", name, "' is not a JSON object");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!j.contains(key)) fail_file(path, "entry '", name, "' has no ", key);
  SafetensorsEntry e;
  e.name = name;
  if (!j["dtype"].is_string()) fail_file(path, "entry '", name, "': dtype is not a string");
  e.dtype = j["dtype"].get<std::string>();
  const size_t elem = dtype_bytes(e.dtype);
  check_printable(path, "dtype", e.dtype);
  if (elem == 0) fail_file(path, "entry '", name, "' has unknown dtype '", e.dtype, "'");

  const json& shape = j["shape"];
  if (!shape.is_array()) fail_file(path, "entry '", name, "': shape is not an array");
  uint64_t bytes = elem;
  for (const json& d : shape) {
    if (!d.is_number_unsigned()) fail_file(path, "entry '", name, "': shape ", shape.dump(),
                                           " is not a list of non-negative integers");
    const uint64_t dim = d.get<uint64_t>();
    if (dim > uint64_t(INT64_MAX) || __builtin_mul_overflow(bytes, dim, &bytes))
      fail_file(path, "entry '", name, "': shape ", shape.dump(), " is too large");
    e.shape.push_back(int64_t(dim));
  }

  const json& offs = j["data_offsets"];
  if (!offs.is_array() || offs.size() != 2 || !offs[0].is_number_unsigned() ||
      !offs[1].is_number_unsigned() || offs[0].get<uint64_t>() > offs[1].get<uint64_t>())
    fail_file(path, "entry '", name, "': data_offsets ", offs.dump(),
              " is not a pair [begin, end] with begin <= end");
  e.begin = offs[0].get<uint64_t>();
  e.end = offs[1].get<uint64_t>();
  if (e.end - e.begin != bytes)
    fail_file(path, "entry '", name, "': data_offsets ", offs.dump(), " span ", e.end - e.begin,
              " bytes but shape ", shape_str(e.shape), " of ", e.dtype, " needs ", bytes);
  return e;
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  Fd fd(path, O_RDONLY | O_CLOEXEC);
  if (fd.get() < 0) fail_file(path, "cannot open (", std::strerror(errno), ")");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail_file(path, "cannot stat (", std::strerror(errno), ")");
  if (S_ISDIR(st.st_mode)) fail_file(path, "is a directory, not a safetensors file");
  const uint64_t file_size = uint64_t(st.st_size);
  if (file_size < 8) fail_file(path, "file is ", file_size, " bytes, shorter than the 8-byte header length");

  uint64_t header_len = 0;
  if (!pread_all(fd.get(), &header_len, 8, 0)) fail_file(path, "cannot read the header length");
  if (header_len > file_size - 8)
    fail_file(path, "header length ", header_len, " exceeds the ", file_size - 8,
              " bytes after the length field (truncated or not a safetensors file)");
  std::string header(header_len, '\0');
  if (!pread_all(fd.get(), header.data(), header_len, 8)) fail_file(path, "cannot read the header");

  json root;
  try {
    root = parse_json_with_depth_limit(header, kMaxHeaderDepth, [&] {
      fail_file(path, "bad JSON header (nested deeper than ", kMaxHeaderDepth, " levels)");
    });
  } catch (const json::exception& e) {
    fail_file(path, "bad JSON header (", e.what(), ")");
  }
  if (!root.is_object()) fail_file(path, "bad JSON header (not an object)");

  SafetensorsFile f;
  f.path_ = path;
  f.data_start_ = 8 + header_len;
  const uint64_t data_size = file_size - f.data_start_;
  for (const auto& [name, value] : root.items()) {
    check_printable(path, "tensor name", name);
    if (name == "__metadata__") {
      if (!value.is_object()) fail_file(path, "__metadata__ is not a JSON object");
      for (const auto& [key, v] : value.items()) {
        check_printable(path, "__metadata__ key", key);
        if (!v.is_string()) fail_file(path, "__metadata__ value of '", key, "' is not a string");
        f.metadata_[key] = v.get<std::string>();
      }
      continue;
    }
    SafetensorsEntry e = parse_entry(path, name, value);
    if (e.end > data_size)
      fail_file(path, "truncated: tensor '", name, "' ends at data byte ", e.end, " but the file holds ",
                data_size, " data bytes");
    f.entries_.emplace(name, std::move(e));
  }
  // The data is the tensors one after another, as the format requires: tensors that overlap, or bytes no
  // tensor owns, make a file no writer made, whose values may depend on who reads it.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& [name, e] : f.entries_) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
    return std::tie(a->begin, a->end) < std::tie(b->begin, b->end);
  });
  uint64_t at = 0;
  for (const SafetensorsEntry* e : by_offset) {
    if (e->begin < at) fail_file(path, "tensor '", e->name, "' starts at data byte ", e->begin, ", inside the tensor before it");
    if (e->begin > at) fail_file(path, "data bytes ", at, " to ", e->begin, " belong to no tensor");
    at = e->end;
  }
  if (at != data_size) fail_file(path, "data bytes ", at, " to ", data_size, " belong to no tensor");
  return f;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) fail_file(path_, "no tensor named '", name, "'");
  return it->second;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& kv : entries_) out.push_back(kv.first);
  return out;
}

void SafetensorsFile::read_f32(const std::string& name, float* dst, const Shape& expected) const {
  const SafetensorsEntry& e = entry(name);
  if (e.shape != expected)
    fail_file(path_, "tensor '", name, "' has shape ", shape_str(e.shape), ", expected ",
              shape_str(expected));
  read_f32_range(name, 0, e.numel(), dst);
}

void SafetensorsFile::read_f32_range(const std::string& name, int64_t elem_begin, int64_t count,
                                     float* dst) const {
  const SafetensorsEntry& e = entry(name);
  if (elem_begin < 0 || count < 0 || elem_begin > e.numel() || count > e.numel() - elem_begin)
    fail_file(path_, "elements [", elem_begin, ", ", elem_begin + count, ") are outside tensor '", name,
              "' of ", e.numel(), " elements");
  const bool f32 = e.dtype == "F32";
  if (!f32 && e.dtype != "F16" && e.dtype != "BF16" && e.dtype != "F64")
    fail_file(path_, "tensor '", name, "' has dtype ", e.dtype, ", which cannot be read as f32");
  if (count == 0) return;

  Fd fd(path_, O_RDONLY | O_CLOEXEC);
  if (fd.get() < 0) fail_file(path_, "cannot open (", std::strerror(errno), ")");
  const size_t elem = dtype_bytes(e.dtype);
  uint64_t offset = data_start_ + e.begin + uint64_t(elem_begin) * elem;
  if (f32) {
    if (!pread_all(fd.get(), dst, size_t(count) * 4, offset))
      fail_file(path_, "short read of tensor '", name, "' (file changed or truncated)");
    check_finite(path_, name, dst, count, elem_begin);
    return;
  }
  // Other dtypes convert through a bounded staging buffer, so a large tensor needs no full copy.
  constexpr int64_t kChunk = 1 << 16;
  std::vector<uint8_t> stage(size_t(std::min(count, kChunk)) * elem);
  for (int64_t done = 0; done < count;) {
    const int64_t n = std::min(kChunk, count - done);
    if (!pread_all(fd.get(), stage.data(), size_t(n) * elem, offset))
      fail_file(path_, "short read of tensor '", name, "' (file changed or truncated)");
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* p = stage.data() + size_t(i) * elem;
      if (e.dtype == "F64") {
        double v;
        std::memcpy(&v, p, 8);
        dst[done + i] = float(v);
      } else {
        uint16_t h;
        std::memcpy(&h, p, 2);
        dst[done + i] = e.dtype == "F16" ? f16_to_f32(h) : bf16_to_f32(h);
      }
    }
    done += n;
    offset += uint64_t(n) * elem;
  }
  check_finite(path_, name, dst, count, elem_begin);
}

uint64_t save_safetensors(const std::string& path, const std::vector<SafetensorsArray>& tensors,
                          const SafetensorsMetadata& metadata, SaveSliceSource* source, Existing existing) {
  json header = json::object();
  uint64_t offset = 0;
  for (const SafetensorsArray& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      fail_file(path, "cannot save a tensor named '", t.name, "'");
    if (header.contains(t.name)) fail_file(path, "tensor '", t.name, "' given twice");
    for (int64_t d : t.shape)
      if (d < 0) fail_file(path, "tensor '", t.name, "' has negative shape ", shape_str(t.shape));
    const uint64_t bytes = uint64_t(shape_numel(t.shape)) * 4;
    if (bytes > 0 && t.data == nullptr && source == nullptr) fail_file(path, "tensor '", t.name, "' has no data");
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    fail_file(path, "cannot encode the header (", e.what(), ")");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_len = text.size();

  AtomicFile file(path, existing);
  Xxh3Stream checksum;
  const auto put = [&](const void* data, size_t bytes) {
    checksum.update(data, bytes);
    file.write(data, bytes);
  };
  put(&header_len, 8);
  put(text.data(), text.size());
  // A slice at a time, small enough to stay in cache from the scan for NaN through the checksum to the
  // copy into the file: one pass over memory where three whole-tensor passes were. A non-finite value
  // found late fails the save all the same: the AtomicFile then leaves the target as `existing` said.
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SafetensorsArray& t = tensors[i];
    const int64_t numel = shape_numel(t.shape);
    for (int64_t begin = 0; begin < numel; begin += kSaveSliceNumel) {
      const int64_t n = std::min(kSaveSliceNumel, numel - begin);
      const float* values = source ? source->take(i, begin, n) : t.data + begin;
      check_finite(path, t.name, values, n, begin);
      put(values, size_t(n) * 4);
      if (source) source->done(i, begin);
    }
  }
  file.commit();
  return checksum.digest();
}

}  // namespace zshard
