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
#include <vector>

#include <zshard/communicator.h>

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
  // hybrid only: one size per group, in rank order, summing to the world (--shard-group 4,2, or node on
  // hosts of unequal sizes). Takes precedence over shard_group.
  std::vector<int> shard_group_sizes;
};

bool params_sharded(StrategyKind kind);
bool grads_sharded(StrategyKind kind);

// The shard groups of a world: runs of consecutive ranks in rank order, of any sizes. Groups of one size
// are the usual case (G ranks each, N/G replicas); unequal ones (4 + 2: a node of each size) shard the
// same units differently, so a unit's flat buffer is padded to a multiple of every size (pad_multiple,
// their least common multiple): each group's shards then divide it evenly, and the shard boundaries of all
// groups fall on the same grid of pad_multiple() slots.
class ShardGroups {
 public:
  explicit ShardGroups(std::vector<int> sizes);  // each >= 1

  int count() const { return int(sizes_.size()); }
  int world_size() const { return first_.back(); }
  int size(int group) const { return sizes_[size_t(group)]; }
  int first_rank(int group) const { return first_[size_t(group)]; }
  int group_of(int rank) const;
  int size_of_rank(int rank) const { return size(group_of(rank)); }
  bool equal() const;
  int pad_multiple() const { return pad_multiple_; }
  const std::vector<int>& sizes() const { return sizes_; }
  std::string describe() const;  // "4" for equal groups of 4, "4,2" otherwise

 private:
  std::vector<int> sizes_;
  std::vector<int> first_;  // first rank of each group, then the world size
  int pad_multiple_ = 1;
};

// "4,2": a list of sizes as --shard-group and --nodes take it.
std::string join_sizes(const std::vector<int>& sizes);

// Units are padded to a multiple of every group's size, their least common multiple: up to that many
// elements of padding per unit, and a grid of that many slots for the shard boundaries. Past this bound
// the padding alone would outweigh the models zshard trains.
constexpr int64_t kMaxPadMultiple = int64_t(1) << 20;
// Refuses, with a UsageError naming `flag`, group sizes ShardGroups cannot take: a size below 1, more
// ranks in all than an int holds, or a least common multiple above kMaxPadMultiple.
void check_group_sizes(const std::vector<int>& sizes, std::string_view flag);

// The shard groups of `options` on a world of `world_size` ranks: one group of one rank per rank for ddp,
// the world for zero1/2/3, hybrid's groups. Throws UsageError when hybrid's groups do not fit the world.
ShardGroups shard_groups(const StrategyOptions& options, int world_size);
// The shard group size of every rank, where all groups have one size (throws UsageError otherwise).
int shard_group_size(const StrategyOptions& options, int world_size);
// Hybrid's group when --shard-group is not given, for every tool: the largest divisor of the world up to
// `node_ranks` (the ranks on one fast intra-node link; 8 GPUs by default) that leaves at least two
// replicas; 1 (no sharding, so no real hybrid) for worlds of 1 to 3 ranks.
constexpr int kDefaultNodeRanks = 8;
int default_shard_group(int world_size, int node_ranks = kDefaultNodeRanks);

// Hybrid's groups from the hosts the world runs on (MPI_COMM_TYPE_SHARED, comm/launch.h): `node` becomes
// the ranks of each host (sizes of their own when the hosts differ), and so does the default (0) when the
// world spans two or more hosts of equal size. A list of sizes must keep every group inside one host.
// Collective over `world`. Throws UsageError for `node` on one host, for hosts whose ranks are not
// consecutive (groups are runs of consecutive ranks), and for a list that crosses a host boundary.
void resolve_node_groups(StrategyOptions& options, comm::Communicator& world);

}  // namespace zshard
