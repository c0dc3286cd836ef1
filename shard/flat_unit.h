// FlatLayout: how one unit's parameters sit in a single flat buffer and how that buffer is cut into
// shards. Parameters are concatenated in UnitSpec order, then padded to a multiple of `pad_multiple` (the
// group size, or a multiple of it when groups of other sizes shard the same unit: see ShardGroups) so the
// buffer splits into `group_size` equal shards; shard i is elements [i*shard_numel, (i+1)*shard_numel).
// Any group size works, including one larger than the unit (the extra shards are all padding).
#pragma once
#include <cstdint>
#include <vector>

#include <zshard/model.h>

#include "kernels/allocator.h"

namespace zshard {

// A unit's flat buffer of values on the host, whole: gathered from the shards for a file, or read from one.
using FlatValues = TrackedFloats;

// Part of a flat range that falls inside one parameter: the unit of work for AdamW (each parameter
// has its own weight-decay flag) and for the gradient norm (padding is never counted).
struct FlatSegment {
  int param;             // index into UnitSpec::params
  int64_t flat_begin;    // position in the flat buffer
  int64_t param_offset;  // position inside the parameter
  int64_t count;
};

class FlatLayout {
 public:
  FlatLayout(const UnitSpec& spec, int group_size, int pad_multiple = 0);  // 0: group_size

  const UnitSpec& spec() const { return spec_; }
  int group_size() const { return group_size_; }
  int pad_multiple() const { return pad_multiple_; }
  int64_t numel() const { return numel_; }          // real elements
  int64_t padded_numel() const { return padded_; }  // numel rounded up to a multiple of pad_multiple
  int64_t shard_numel() const { return padded_ / group_size_; }
  int64_t offset(int param) const { return offsets_[param]; }
  int64_t shard_begin(int shard) const { return shard * shard_numel(); }
  // The padded buffer cut into `shares` equal pieces, the last ones reaching past it where they must (a
  // secondary group's, which need not divide the padding).
  int64_t share_numel(int shares) const { return (padded_ + shares - 1) / shares; }

  // The parameter pieces inside flat range [begin, end); padding is skipped.
  std::vector<FlatSegment> segments(int64_t begin, int64_t end) const;
  std::vector<FlatSegment> shard_segments(int shard) const {
    return segments(shard_begin(shard), shard_begin(shard) + shard_numel());
  }

  // Tensor views of every parameter inside a full flat buffer (padded_numel elements).
  UnitTensors views(const Tensor& flat) const;

 private:
  UnitSpec spec_;
  int group_size_;
  int pad_multiple_;
  std::vector<int64_t> offsets_;
  int64_t numel_ = 0;
  int64_t padded_ = 0;
};

}  // namespace zshard
