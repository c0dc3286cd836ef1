// Safetensors weights files: an 8-byte little-endian header length N, N bytes of JSON describing each
// tensor ({"name": {"dtype", "shape", "data_offsets": [begin, end]}}, optional "__metadata__"), then the
// raw data, offsets relative to its start. The format PyTorch and Hugging Face use, so weights move both
// ways. Reads seek to one tensor (or a slice of it), so a rank never loads the whole file.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <zshard/tensor.h>

#include "kernels/io/atomic_file.h"

namespace zshard {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;    // as in the file: "F32", "F16", "BF16", "F64", ...
  Shape shape;
  uint64_t begin = 0;   // byte offsets relative to the start of the data section
  uint64_t end = 0;
  int64_t numel() const { return shape_numel(shape); }
};

using SafetensorsMetadata = std::map<std::string, std::string>;

// An opened file: the header is parsed and validated up front; tensor data is read on demand.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return path_; }
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  const SafetensorsMetadata& metadata() const { return metadata_; }

  // Reads the whole tensor as f32 (F16, BF16 and F64 are converted) after checking its shape. Both reads
  // fail on a NaN or inf, naming the tensor and the element.
  void read_f32(const std::string& name, float* dst, const Shape& expected) const;
  // Reads `count` elements starting at flat element `elem_begin` (row-major order).
  void read_f32_range(const std::string& name, int64_t elem_begin, int64_t count, float* dst) const;

 private:
  std::string path_;
  uint64_t data_start_ = 0;  // 8 + header length
  std::map<std::string, SafetensorsEntry> entries_;
  SafetensorsMetadata metadata_;
};

// One f32 tensor to save; `data` holds shape_numel(shape) host floats.
struct SafetensorsArray {
  std::string name;
  const float* data = nullptr;
  Shape shape;
};

// save_safetensors writes each tensor's data a slice of this many elements at a time (the last shorter).
constexpr int64_t kSaveSliceNumel = 1 << 18;  // 1 MiB of floats

// Where save_safetensors takes the values of a slice from, when the arrays' own data may change while
// the file is written (a save beside training): take() before the slice is written, in file order, and
// done() once it is in the file. A take() that throws fails the save like a write error.
class SaveSliceSource {
 public:
  virtual const float* take(size_t tensor, int64_t begin, int64_t count) = 0;
  virtual void done(size_t tensor, int64_t begin) = 0;

 protected:
  ~SaveSliceSource() = default;
};

// Writes F32 tensors in the given order (header padded with spaces to a multiple of 8 bytes) through an
// AtomicFile, so a reader never sees a partial file. Refuses tensors holding NaN or inf, found as the data
// is written (the target is then left as it was, unless `existing` gave it up). Returns the XXH3-64 of the
// file's bytes (Xxh3Stream), taken as they were written. The values come from each array's data, or from
// `source` when given.
uint64_t save_safetensors(const std::string& path, const std::vector<SafetensorsArray>& tensors,
                          const SafetensorsMetadata& metadata = {}, SaveSliceSource* source = nullptr,
                          Existing existing = Existing::replace);

}  // namespace zshard
