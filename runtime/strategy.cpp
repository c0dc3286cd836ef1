#include "runtime/strategy.h"

#include <algorithm>
#include <string>
#include <vector>

#include "comm/launch.h"
#include "kernels/error.h"

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

int shard_group_size(const StrategyOptions& options, int world_size) {
  switch (options.kind) {
    case StrategyKind::ddp: return 1;
    case StrategyKind::zero1:
    case StrategyKind::zero2:
    case StrategyKind::zero3: return world_size;
    case StrategyKind::hybrid: {
      const int g = options.shard_group == 0 ? default_shard_group(world_size) : options.shard_group;
      if (g < 1 || world_size % g != 0)
        throw UsageError(detail::concat("--shard-group ", g, " does not divide the world size ",
                                        world_size, " (hybrid needs groups of G consecutive ranks)"));
      return g;
    }
  }
  return 1;
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
  std::vector<int> sizes;
  bool consecutive = true;
  for (int r = 0; r < n; ++r) {
    const int first = all[2 * r], size = all[2 * r + 1];
    if (first == r) sizes.push_back(size);
    consecutive = consecutive && first <= r && r < first + size;
  }
  const bool node_asked = options.shard_group == kShardGroupNode;
  if (sizes.size() < 2) {
    if (node_asked)
      throw UsageError(detail::concat("--shard-group node: all ", n, " ranks run on one host (node groups need "
                                      "two or more hosts; give a group size instead)"));
    return;
  }
  const bool equal = std::all_of(sizes.begin(), sizes.end(), [&](int s) { return s == sizes[0]; });
  if (!equal || !consecutive || (!node_asked && sizes[0] == 1)) {
    if (!node_asked) return;  // the size-based default still applies
    std::string list;
    for (int s : sizes) list += (list.empty() ? "" : ",") + std::to_string(s);
    throw UsageError(detail::concat("--shard-group node: the hosts hold ", list, " ranks",
                                    consecutive ? "" : " in interleaved rank order",
                                    "; node groups need hosts of equal size, each a run of consecutive ranks"));
  }
  options.shard_group = sizes[0];
}

StrategyGroups StrategyGroups::make(comm::Communicator& world, int group) {
  const int r = world.rank();
  StrategyGroups g;
  g.shard = world.split(r / group, r);
  g.replica = world.split(r % group, r);
  return g;
}

}  // namespace zshard
