// Strategies: what each rank keeps resident and how gradients are reduced. The table of
// ../shared/DESIGN.md reduces to three questions, answered here once so that the rest of the runtime
// never switches on the strategy name:
//   - the shard group: the ranks a unit is split across (1 for ddp, the world for zero1/2/3, G for hybrid);
//   - are parameters sharded between uses (zero3, hybrid), or resident in full;
//   - are gradients sharded (zero2, zero3, hybrid), or resident in full (ddp, zero1).
// Gradients are reduce-scattered inside the shard group, then all-reduced across the replica group
// (ranks holding the same shard). ddp is the degenerate case: shard group of one, all-reduce over the world.
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include "comm/communicator.h"

namespace zshard {

enum class StrategyKind { ddp, zero1, zero2, zero3, hybrid };

StrategyKind parse_strategy(std::string_view name);  // throws UsageError naming the valid ones
std::string_view strategy_name(StrategyKind kind);

// --shard-group node: each host's ranks form a shard group (resolve_node_groups).
constexpr int kShardGroupNode = -1;

struct StrategyOptions {
  StrategyKind kind = StrategyKind::ddp;
  int shard_group = 0;                // hybrid only: ranks per shard group (divides the world); 0: default
  bool reshard_after_forward = true;  // zero3/hybrid: free gathered params after each unit's forward
  int max_inflight = 2;               // zero3/hybrid: gathered units alive at once (prefetch depth + 1)
};

bool params_sharded(StrategyKind kind);
bool grads_sharded(StrategyKind kind);
// Shard group size for a world of `world_size` ranks; throws UsageError when hybrid's group does not fit.
int shard_group_size(const StrategyOptions& options, int world_size);
// Hybrid's group when --shard-group is not given, for every tool: the largest divisor of the world up to
// `node_ranks` (the ranks on one fast intra-node link; 8 GPUs by default) that leaves at least two
// replicas; 1 (no sharding, so no real hybrid) for worlds of 1 to 3 ranks.
constexpr int kDefaultNodeRanks = 8;
int default_shard_group(int world_size, int node_ranks = kDefaultNodeRanks);

// Hybrid's groups from the hosts the world runs on (MPI_COMM_TYPE_SHARED, comm/launch.h): `node` becomes
// the ranks per host, and so does the default (0) when the world spans two or more hosts of equal size.
// Collective over `world`. Throws UsageError for `node` on one host, or for hosts of unequal sizes or
// whose ranks are not consecutive (groups are runs of consecutive ranks).
void resolve_node_groups(StrategyOptions& options, comm::Communicator& world);

// The two sub-communicators a strategy reduces over; both are views of `world`.
struct StrategyGroups {
  std::unique_ptr<comm::Communicator> shard;    // ranks that split a unit between them
  std::unique_ptr<comm::Communicator> replica;  // ranks holding the same shard
  static StrategyGroups make(comm::Communicator& world, int shard_group_size);
};

}  // namespace zshard
