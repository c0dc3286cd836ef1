#include "shard/flat_unit.h"

#include <algorithm>

namespace zshard {

int64_t UnitSpec::numel() const {
  int64_t n = 0;
  for (const auto& p : params) n += p.numel();
  return n;
}

FlatLayout::FlatLayout(const UnitSpec& spec, int group_size, int pad_multiple)
    : spec_(spec), group_size_(group_size), pad_multiple_(pad_multiple == 0 ? group_size : pad_multiple) {
  ZS_CHECK(group_size >= 1, "shard group size must be >= 1, got ", group_size);
  ZS_CHECK(pad_multiple_ % group_size == 0, "unit padding to a multiple of ", pad_multiple_,
           " does not split into ", group_size, " shards");
  for (const auto& p : spec_.params) {
    offsets_.push_back(numel_);
    numel_ += p.numel();
  }
  // At least one element per shard, so every rank owns a (possibly all-padding) non-empty shard.
  padded_ = std::max<int64_t>((numel_ + pad_multiple_ - 1) / pad_multiple_, 1) * pad_multiple_;
}

std::vector<FlatSegment> FlatLayout::segments(int64_t begin, int64_t end) const {
  std::vector<FlatSegment> out;
  for (size_t i = 0; i < spec_.params.size(); ++i) {
    const int64_t p_begin = offsets_[i], p_end = p_begin + spec_.params[i].numel();
    const int64_t lo = std::max(begin, p_begin), hi = std::min(end, p_end);
    if (lo < hi) out.push_back({int(i), lo, lo - p_begin, hi - lo});
  }
  return out;
}

UnitTensors FlatLayout::views(const Tensor& flat) const {
  ZS_CHECK(flat.numel() == padded_, "unit ", spec_.name, ": flat buffer has ", flat.numel(),
           " elements, layout needs ", padded_);
  UnitTensors out;
  for (size_t i = 0; i < spec_.params.size(); ++i) out.push_back(flat.view(offsets_[i], spec_.params[i].shape));
  return out;
}

}  // namespace zshard
