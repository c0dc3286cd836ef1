// The sharding plan: what each rank keeps and where, worked out once per run (think of FSDP2's DeviceMesh
// with its sharding policy). What a user asks for is PlanOptions; resolve_plan() turns it into the
// ShardPlan that the engine, the memory estimator and report, and the tools read, and nothing else
// decides a shard group again.
//
// A strategy answers three questions, so that nothing downstream switches on its name:
//   - the shard groups: the ranks a unit is split across (1 for ddp, the world for zero1/2/3, G for hybrid);
//   - are parameters sharded between uses (zero3, hybrid), or resident in full;
//   - are gradients sharded (zero2, zero3, hybrid), or resident in full (ddp, zero1).
// Gradients are reduce-scattered inside the shard group, then all-reduced across the replica group (the
// ranks holding the same shard). ddp is the degenerate case: groups of one, an all-reduce over the world.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <zshard/communicator.h>
#include <zshard/dtype.h>

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

struct StrategyOptions {
  StrategyKind kind = StrategyKind::ddp;
  ShardGroupRequest shard_group;      // hybrid only
  bool reshard_after_forward = true;  // zero3/hybrid: free gathered params after each unit's forward
  int max_inflight = 2;               // zero3/hybrid: gathered units alive at once (prefetch depth + 1)
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

// "4,2": a list of sizes as --shard-group and --nodes take it.
std::string join_sizes(const std::vector<int>& sizes);

// Units are padded to a multiple of every group's size, their least common multiple: up to that many
// elements of padding per unit, and a grid of that many slots for the shard boundaries. Past this bound
// the padding alone would outweigh the models zshard trains.
constexpr int64_t kMaxPadMultiple = int64_t(1) << 20;
// Refuses, with a UsageError naming `flag`, group sizes ShardGroups cannot take: a size below 1, more
// ranks in all than an int holds, or a least common multiple above kMaxPadMultiple.
void check_group_sizes(const std::vector<int>& sizes, std::string_view flag);

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

// Where the engine keeps a model and in which dtypes (the engine's header tells the dtype story).
struct Placement {
  Device device = Device::cpu;
  DType param_dtype = DType::f32;   // compute copy and gradients: f32, or bf16 (cuda)
  DType reduce_dtype = DType::f32;  // gradient collectives: f32 or bf16
  // ZeRO-Offload: the fp32 master shard and Adam m and v live in host memory and AdamW runs there. The
  // master is then always a buffer of its own, also beside an fp32 compute copy: 12 bytes per owned
  // parameter on the host, plus on a device the host copy of the owned gradients. The cpu device only
  // moves the accounting.
  bool offload_optimizer = false;
};

// How --param-dtype and --reduce-dtype spell a dtype: fp32, bf16.
std::string_view dtype_flag(DType dtype);

// What a run asks of the engine.
struct PlanOptions {
  StrategyOptions strategy;
  Placement placement;              // --device, --param-dtype, --reduce-dtype, --offload
  std::optional<CommBackend> comm;  // --comm; unset: nccl on cuda, mpi on cpu
  double comm_timeout_s = 300;      // --comm-timeout: how long any collective may take
};
constexpr double kDefaultCommTimeout = PlanOptions{}.comm_timeout_s;

// --comm, or its default for --device.
CommBackend comm_backend(const PlanOptions& options);
// Checks what needs neither a world nor a device: the dtypes, the timeout, and flags of other strategies
// than the one asked for. Throws UsageError naming the flag. (resolve_plan also checks that this build
// and device can run the placement.)
void validate_plan_options(const PlanOptions& options);

// The resolved plan: every rank of the world holds the same one.
struct ShardPlan {
  StrategyKind kind = StrategyKind::ddp;
  ShardGroupRequest shard_group;  // as asked (--shard-group); `groups` is what it resolved to
  ShardGroups groups{{1}};
  bool reshard_after_forward = true;
  int max_inflight = 2;
  Placement placement;
  CommBackend comm = CommBackend::mpi;
  double comm_timeout_s = kDefaultCommTimeout;

  int world_size() const { return groups.world_size(); }
  bool params_sharded() const { return zshard::params_sharded(kind); }
  bool grads_sharded() const { return zshard::grads_sharded(kind); }
};

// Sets `world`'s deadline for every collective from now on to --comm-timeout (when valid; resolve_plan
// refuses it otherwise). Issues none.
void apply_comm_timeout(const PlanOptions& options, comm::Communicator& world);

// The plan of `options` on `world`. Collective over `world`, and its first collective: it sets the
// world's timeout before issuing any, then learns the hosts (`node` groups, and the default on two or more
// hosts) and makes this rank's device current (on cuda its GPU: local rank modulo the visible GPUs).
// Throws UsageError naming the flag on every rank alike for options that do not fit the world, the hosts
// or the device (the test hook ZSHARD_TEST_STALL_SET_UP=RANK:MS holds rank RANK for MS ms first).
ShardPlan resolve_plan(const PlanOptions& options, comm::Communicator& world);
// The plan on `world_size` ranks by arithmetic alone, for a run that is not launched (the estimator,
// zshard-mem): no hosts (`node` is refused), no device.
ShardPlan plan_for_world(const PlanOptions& options, int world_size);
// The plan that resolve_plan would make on hosts of `host_sizes` ranks each, in rank order, for a run that
// is not launched yet (zshard-run sizing a relaunch): the hosts' groups for hybrid, no device.
ShardPlan plan_on_hosts(const PlanOptions& options, const std::vector<int>& host_sizes);

}  // namespace zshard
