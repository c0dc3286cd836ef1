// The strategy switch (--strategy ddp|zero1|zero2|zero3|hybrid, StrategyOptions::kind). A strategy answers
// three questions, so that nothing downstream switches on its name:
//   - the shard groups: the ranks a unit is split across (1 for ddp, the world for zero1/2/3, G for hybrid);
//   - are parameters sharded between uses (zero3, hybrid), or resident in full;
//   - are gradients sharded (zero2, zero3, hybrid), or resident in full (ddp, zero1).
// Gradients are reduce-scattered inside the shard group, then all-reduced across the replica group (the
// ranks holding the same shard). ddp is the degenerate case: groups of one, an all-reduce over the world.
// plan.h resolves a strategy with the placement and backend into the plan the engine runs.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace zshard {

enum class StrategyKind { ddp, zero1, zero2, zero3, hybrid };

StrategyKind parse_strategy(std::string_view name);  // throws UsageError naming the valid ones
std::string_view strategy_name(StrategyKind kind);
bool params_sharded(StrategyKind kind);
bool grads_sharded(StrategyKind kind);

// hybrid's shard groups as asked (--shard-group): by default the largest divisor of the world up to a node
// (or each host's ranks across two or more hosts), `node` for each host's ranks, one size G for equal
// groups of G, or a list with one size per group in rank order (4,2: a node of 4 beside a node of 2).
class ShardGroupRequest {
 public:
  enum class Kind { automatic, node, sizes };
  ShardGroupRequest() = default;
  static ShardGroupRequest node() { return ShardGroupRequest(Kind::node, {}); }
  static ShardGroupRequest equal(int size) { return ShardGroupRequest(Kind::sizes, {size}); }
  static ShardGroupRequest list(std::vector<int> sizes) { return ShardGroupRequest(Kind::sizes, std::move(sizes)); }

  Kind kind() const { return kind_; }
  bool automatic() const { return kind_ == Kind::automatic; }
  // One size: groups of that size filling the world; several: one group each.
  const std::vector<int>& sizes() const { return sizes_; }
  std::string text() const;  // as the flag takes it: "auto", "node", "4", "4,2"
  bool operator==(const ShardGroupRequest&) const = default;

 private:
  ShardGroupRequest(Kind kind, std::vector<int> sizes) : kind_(kind), sizes_(std::move(sizes)) {}
  Kind kind_ = Kind::automatic;
  std::vector<int> sizes_;
};

// How zero3 and hybrid send parameters to their gathers (--quantize-gathers). int8 is ZeRO++'s qwZ: each
// rank sends its shard of the compute copy as int8 with an fp32 absmax scale per block of at most 256
// elements, blocks cut at every parameter boundary so that none mixes two parameters, quantized once per
// update, and every rank, the owner included, computes with the dequantized values, so all ranks hold
// identical weights. The fp32 master is never quantized.
enum class GatherQuantization { none, int8 };

GatherQuantization parse_gather_quantization(std::string_view name);  // throws UsageError naming the valid ones
std::string_view gather_quantization_name(GatherQuantization q);

// How the gradients travel inside the shard group (--quantize-reductions): int8 and int4 are ZeRO++'s qgZ.
// Each rank quantizes its unit gradient chunk by chunk, chunk r being rank r's shard (an fp32 absmax scale
// per block of at most 256 elements in int8, 64 in int4, none mixing two parameters), an all-to-all
// hands every owner its chunks from every rank, and the owner dequantizes and sums them in fp32, so
// each gradient is quantized once, never a partial sum. For the
// strategies that reduce-scatter (zero1, zero2, zero3, hybrid); hybrid's all-reduce across groups stays
// in the reduce dtype.
enum class ReductionQuantization { none, int8, int4 };

ReductionQuantization parse_reduction_quantization(std::string_view name);  // throws UsageError naming the valid ones
std::string_view reduction_quantization_name(ReductionQuantization q);

// Where zero3 keeps a unit between its forward and its backward (--secondary-shard): ZeRO++'s hpZ. After a
// unit's forward each rank keeps its share of the gathered unit within a smaller group (each host's ranks,
// or groups of N consecutive ranks), so that backward's gather runs inside that group, in the compute
// dtype, instead of across the world. It sits between --reshard-after-forward true (keep one world shard,
// gather across the world again) and false (keep the whole unit); a secondary group of one rank would be
// false and one of the world would be true, so those are refused under their own name. hybrid's gathers
// already stay inside its shard group, so it is zero3's alone.
struct SecondaryShard {
  enum class Kind { none, host, size };
  Kind kind = Kind::none;
  int size = 0;  // Kind::size: ranks per secondary group
  bool operator==(const SecondaryShard&) const = default;
};

SecondaryShard parse_secondary_shard(std::string_view text);  // none, host or N >= 2; throws UsageError
std::string secondary_shard_text(const SecondaryShard& s);    // as the flag takes it

struct StrategyOptions {
  StrategyKind kind = StrategyKind::ddp;
  ShardGroupRequest shard_group;      // hybrid only
  bool reshard_after_forward = true;  // zero3/hybrid: free gathered params after each unit's forward
  int max_inflight = 2;               // zero3/hybrid: gathered units alive at once (prefetch depth + 1)
  GatherQuantization quantize_gathers = GatherQuantization::none;  // zero3/hybrid
  ReductionQuantization quantize_reductions = ReductionQuantization::none;  // zero1/2/3, hybrid
  SecondaryShard secondary_shard{};  // zero3
  bool operator==(const StrategyOptions&) const = default;
};

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

// The shard groups of `options` on `world_size` ranks, by arithmetic alone: one group of one rank per rank
// for ddp, the world for zero1/2/3, hybrid's groups (by default the default_shard_group). Throws
// UsageError for groups that do not fit the world, and for `node`, which needs the hosts (resolve_plan).
ShardGroups shard_groups(const StrategyOptions& options, int world_size);
// The shard group size of every rank, where all groups have one size (throws UsageError otherwise).
int shard_group_size(const StrategyOptions& options, int world_size);
// Hybrid's group when neither hosts nor --shard-group say: the largest divisor of the world up to
// `node_ranks` (the ranks on one fast intra-node link; 8 GPUs by default) that leaves at least two
// replicas; 1 (no sharding, so no real hybrid) for worlds of 1 to 3 ranks.
constexpr int kDefaultNodeRanks = 8;
int default_shard_group(int world_size, int node_ranks = kDefaultNodeRanks);

}  // namespace zshard
