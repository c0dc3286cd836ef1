// A strategy's three answers (nothing downstream switches on its name): the shard groups it splits
// the world into, whether parameters are sharded between uses, whether gradients are sharded.
#include <zshard/strategy.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include <zshard/error.h>

#include "kernels/option_names.h"
#include "shard/strategy_internals.h"

namespace zshard {

StrategyKind parse_strategy(std::string_view name) {
  if (name == "ddp") return StrategyKind::ddp;
  if (name == "zero1") return StrategyKind::zero1;
  if (name == "zero2") return StrategyKind::zero2;
  if (name == "zero3") return StrategyKind::zero3;
  if (name == "hybrid") return StrategyKind::hybrid;
  refuse(option_name(Option::strategy), ": unknown strategy '", name, "' (valid: ddp, zero1, zero2, zero3, hybrid)");
}

std::string_view strategy_name(StrategyKind kind) {
  switch (kind) {
    case StrategyKind::ddp: return "ddp";
    case StrategyKind::zero1: return "zero1";
    case StrategyKind::zero2: return "zero2";
    case StrategyKind::zero3: return "zero3";
    case StrategyKind::hybrid: return "hybrid";
  }
  return "?";
}

GatherQuantization parse_gather_quantization(std::string_view name) {
  if (name == "none") return GatherQuantization::none;
  if (name == "int8") return GatherQuantization::int8;
  if (name == "int4")
    refuse(option_name(Option::quantize_gathers), " int4: 4-bit parameter gathers are not supported (valid: none, int8)");
  refuse(option_name(Option::quantize_gathers), ": unknown value '", name, "' (valid: none, int8)");
}

std::string_view gather_quantization_name(GatherQuantization q) { return q == GatherQuantization::int8 ? "int8" : "none"; }

ReductionQuantization parse_reduction_quantization(std::string_view name) {
  for (ReductionQuantization q : {ReductionQuantization::none, ReductionQuantization::int8, ReductionQuantization::int4})
    if (name == reduction_quantization_name(q)) return q;
  refuse(option_name(Option::quantize_reductions), ": unknown value '", name, "' (valid: none, int8, int4)");
}

std::string_view reduction_quantization_name(ReductionQuantization q) {
  switch (q) {
    case ReductionQuantization::none: return "none";
    case ReductionQuantization::int8: return "int8";
    case ReductionQuantization::int4: return "int4";
  }
  return "?";
}

SecondaryShard parse_secondary_shard(std::string_view text) {
  if (text == "none") return {};
  if (text == "host") return {SecondaryShard::Kind::host, 0};
  int size = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), size);
  if (error != std::errc() || end != text.data() + text.size() || size < 1)
    refuse(option_name(Option::secondary_shard), ": unknown value '", text, "' (valid: none, host, or a group size N >= 2)");
  if (size == 1)
    refuse(option_name(Option::secondary_shard), " 1: a secondary group of one rank keeps whole units from forward to "
           "backward, which is ", option_setting(Option::reshard_after_forward, "false", "false"));
  return {SecondaryShard::Kind::size, size};
}

std::string secondary_shard_text(const SecondaryShard& s) {
  switch (s.kind) {
    case SecondaryShard::Kind::none: return "none";
    case SecondaryShard::Kind::host: return "host";
    case SecondaryShard::Kind::size: return std::to_string(s.size);
  }
  return "?";
}

bool params_sharded(StrategyKind kind) { return kind == StrategyKind::zero3 || kind == StrategyKind::hybrid; }

bool grads_sharded(StrategyKind kind) {
  return kind == StrategyKind::zero2 || kind == StrategyKind::zero3 || kind == StrategyKind::hybrid;
}

std::string ShardGroupRequest::text() const {
  switch (kind_) {
    case Kind::automatic: return "auto";
    case Kind::node: return "node";
    case Kind::sizes: return join_sizes(sizes_);
  }
  return "?";
}

namespace {

// The least common multiple of `sizes` (each >= 1), or kMaxPadMultiple + 1 once it passes the bound:
// computed in 64 bits and stopped there, it cannot overflow.
int64_t bounded_lcm(const std::vector<int>& sizes) {
  int64_t lcm = 1;
  for (int g : sizes) {
    lcm = lcm / std::gcd(lcm, int64_t(g)) * g;
    if (lcm > kMaxPadMultiple) return kMaxPadMultiple + 1;
  }
  return lcm;
}

int64_t total(const std::vector<int>& sizes) { return std::accumulate(sizes.begin(), sizes.end(), int64_t{0}); }

}  // namespace

void check_group_sizes(const std::vector<int>& sizes, std::string_view flag) {
  for (int g : sizes)
    if (g < 1) refuse(flag, ": group sizes must be >= 1, got ", g);
  if (total(sizes) > INT_MAX) refuse(flag, ": ", total(sizes), " ranks in all, more than ", INT_MAX);
  if (bounded_lcm(sizes) > kMaxPadMultiple)
    refuse(flag, " ", join_sizes(sizes), ": every unit is padded to a multiple of each group's size, and the least "
           "common multiple of these exceeds ", kMaxPadMultiple,
           "; choose sizes with a smaller common multiple (groups of one size need none)");
}

ShardGroups::ShardGroups(std::vector<int> sizes) : sizes_(std::move(sizes)), first_{0} {
  ZS_CHECK(!sizes_.empty(), "a world has at least one shard group");
  for (int g : sizes_) ZS_CHECK(g >= 1, "shard groups hold at least one rank, got ", g);
  ZS_CHECK(total(sizes_) <= INT_MAX && bounded_lcm(sizes_) <= kMaxPadMultiple, "shard groups of sizes ",
           join_sizes(sizes_), ": too many ranks, or a least common multiple above ", kMaxPadMultiple);
  for (int g : sizes_) first_.push_back(first_.back() + g);
  pad_multiple_ = int(bounded_lcm(sizes_));
}

int ShardGroups::group_of(int rank) const {
  ZS_CHECK(rank >= 0 && rank < world_size(), "rank ", rank, " outside a world of ", world_size());
  return int(std::upper_bound(first_.begin(), first_.end(), rank) - first_.begin()) - 1;
}

bool ShardGroups::equal() const {
  return std::all_of(sizes_.begin(), sizes_.end(), [&](int g) { return g == sizes_[0]; });
}

std::string join_sizes(const std::vector<int>& sizes) {
  std::string list;
  for (int g : sizes) {
    if (!list.empty()) list += ',';
    list += std::to_string(g);
  }
  return list;
}

std::string ShardGroups::describe() const { return equal() ? std::to_string(sizes_[0]) : join_sizes(sizes_); }

ShardGroups shard_groups(const StrategyOptions& options, int world_size) {
  switch (options.kind) {
    case StrategyKind::ddp: return ShardGroups(std::vector<int>(size_t(world_size), 1));
    case StrategyKind::zero1:
    case StrategyKind::zero2:
    case StrategyKind::zero3: return ShardGroups({world_size});
    case StrategyKind::hybrid: break;
  }
  const ShardGroupRequest& asked = options.shard_group;
  if (asked.kind() == ShardGroupRequest::Kind::node)
    refuse(option_name(Option::shard_group), " node: the hosts decide node groups, and this plan has none (give the nodes' sizes, "
          "e.g. 4,2)");
  if (!asked.automatic() && asked.sizes().empty())
    refuse(option_name(Option::shard_group), ": an empty list of group sizes (give one size, or one per group)");
  if (asked.sizes().size() > 1) {
    const std::vector<int>& sizes = asked.sizes();
    check_group_sizes(sizes, option_name(Option::shard_group));
    if (total(sizes) != world_size)
      refuse(option_name(Option::shard_group), " ", join_sizes(sizes), ": the groups hold ", total(sizes), " ranks, the world has ",
             world_size);
    return ShardGroups(sizes);
  }
  const int g = asked.automatic() ? default_shard_group(world_size) : asked.sizes()[0];
  if (g < 1 || world_size % g != 0)
    refuse(option_name(Option::shard_group), " ", g, " does not divide the world size ", world_size,
          " (hybrid needs groups of G consecutive ranks; give unequal groups as a list of sizes, e.g. 4,2)");
  return ShardGroups(std::vector<int>(size_t(world_size / g), g));
}

int shard_group_size(const StrategyOptions& options, int world_size) {
  const ShardGroups groups = shard_groups(options, world_size);
  if (!groups.equal()) refuse(option_name(Option::shard_group), " ", groups.describe(), ": this needs groups of one size");
  return groups.size(0);
}

int default_shard_group(int world_size, int node_ranks) {
  for (int g = std::min(node_ranks, world_size / 2); g > 1; --g)
    if (world_size % g == 0) return g;
  return 1;
}

}  // namespace zshard
