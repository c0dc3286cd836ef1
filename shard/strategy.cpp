#include "shard/strategy.h"

#include <algorithm>
#include <climits>
#include <numeric>
#include <string>
#include <vector>

#include <zshard/error.h>

#include "comm/launch.h"

namespace zshard {

StrategyKind parse_strategy(std::string_view name) {
  if (name == "ddp") return StrategyKind::ddp;
  if (name == "zero1") return StrategyKind::zero1;
  if (name == "zero2") return StrategyKind::zero2;
  if (name == "zero3") return StrategyKind::zero3;
  if (name == "hybrid") return StrategyKind::hybrid;
  throw UsageError(detail::concat("--strategy: unknown strategy '", name,
                                  "' (valid: ddp, zero1, zero2, zero3, hybrid)"));
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

bool params_sharded(StrategyKind kind) { return kind == StrategyKind::zero3 || kind == StrategyKind::hybrid; }

bool grads_sharded(StrategyKind kind) {
  return kind == StrategyKind::zero2 || kind == StrategyKind::zero3 || kind == StrategyKind::hybrid;
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
    if (g < 1) throw UsageError(detail::concat(flag, ": group sizes must be >= 1, got ", g));
  if (total(sizes) > INT_MAX)
    throw UsageError(detail::concat(flag, ": ", total(sizes), " ranks in all, more than ", INT_MAX));
  if (bounded_lcm(sizes) > kMaxPadMultiple)
    throw UsageError(detail::concat(flag, " ", join_sizes(sizes), ": every unit is padded to a multiple of each group's "
                                    "size, and the least common multiple of these exceeds ", kMaxPadMultiple,
                                    "; choose sizes with a smaller common multiple (groups of one size need none)"));
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
  for (int g : sizes) list += (list.empty() ? "" : ",") + std::to_string(g);
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
  if (!options.shard_group_sizes.empty()) {
    const std::vector<int>& sizes = options.shard_group_sizes;
    check_group_sizes(sizes, "--shard-group");
    if (total(sizes) != world_size)
      throw UsageError(detail::concat("--shard-group ", join_sizes(sizes), ": the groups hold ", total(sizes),
                                      " ranks, the world has ", world_size));
    return ShardGroups(sizes);
  }
  const int g = options.shard_group == 0 ? default_shard_group(world_size) : options.shard_group;
  if (g < 1 || world_size % g != 0)
    throw UsageError(detail::concat("--shard-group ", g, " does not divide the world size ", world_size,
                                    " (hybrid needs groups of G consecutive ranks; give unequal groups as a "
                                    "list of sizes, e.g. 4,2)"));
  return ShardGroups(std::vector<int>(size_t(world_size / g), g));
}

int shard_group_size(const StrategyOptions& options, int world_size) {
  const ShardGroups groups = shard_groups(options, world_size);
  if (!groups.equal())
    throw UsageError(detail::concat("--shard-group ", groups.describe(), ": this needs groups of one size"));
  return groups.size(0);
}

int default_shard_group(int world_size, int node_ranks) {
  for (int g = std::min(node_ranks, world_size / 2); g > 1; --g)
    if (world_size % g == 0) return g;
  return 1;
}

void resolve_node_groups(StrategyOptions& options, comm::Communicator& world) {
  if (options.kind != StrategyKind::hybrid || options.shard_group > 0) return;
  const int n = world.size();
  const int mine[2] = {comm::first_rank_on_this_host(), comm::ranks_on_this_host()};
  std::vector<int> all(size_t(2 * n));
  world.all_gather(mine, all.data(), 2, DType::i32)->wait();
  // Hosts in rank order, each a run of consecutive ranks: first rank and size of each.
  std::vector<int> hosts;
  bool consecutive = true;
  for (int r = 0; r < n; ++r) {
    const int first = all[2 * r], size = all[2 * r + 1];
    if (first == r) hosts.push_back(size);
    consecutive = consecutive && first <= r && r < first + size;
  }
  if (consecutive) check_group_sizes(hosts, "the hosts' ranks");
  if (!options.shard_group_sizes.empty()) {
    // A list: groups may split a host but not span two (a group's gathers are what the node link is for).
    if (hosts.size() < 2 || !consecutive) return;
    const ShardGroups on_hosts(hosts), list = shard_groups(options, n);  // throws for sizes that miss the world
    for (int g = 0; g < list.count(); ++g)
      if (on_hosts.group_of(list.first_rank(g)) != on_hosts.group_of(list.first_rank(g) + list.size(g) - 1))
        throw UsageError(detail::concat("--shard-group ", join_sizes(options.shard_group_sizes),
                                        ": a group spans two hosts (the hosts hold ", join_sizes(hosts),
                                        " ranks; each group must lie inside one host)"));
    return;
  }
  const bool node_asked = options.shard_group == kShardGroupNode;
  if (hosts.size() < 2) {
    if (node_asked)
      throw UsageError(detail::concat("--shard-group node: all ", n, " ranks run on one host (node groups need "
                                      "two or more hosts; give a group size or a list of sizes instead)"));
    return;
  }
  if (!consecutive) {
    if (!node_asked) return;  // the size-based default still applies
    throw UsageError(detail::concat("--shard-group node: the hosts hold ", join_sizes(hosts),
                                    " ranks in interleaved rank order; node groups need each host's ranks to "
                                    "be a run of consecutive ranks"));
  }
  const bool equal = ShardGroups(hosts).equal();
  if (!node_asked && equal && hosts[0] == 1) return;  // one rank per host: nothing to shard inside a node
  if (equal) {
    options.shard_group = hosts[0];
  } else {
    options.shard_group = 0;
    options.shard_group_sizes = hosts;
  }
}

}  // namespace zshard
