// The sharding plan: what each rank keeps and where, worked out once per run (think of FSDP2's DeviceMesh
// with its sharding policy). What a user asks for is PlanOptions (the strategy, strategy.h, and the
// placement); resolve_plan() turns it into the ShardPlan that the engine, the memory estimator and
// report, and the tools read, and nothing else decides a shard group again.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <zshard/communicator.h>
#include <zshard/dtype.h>
#include <zshard/strategy.h>

namespace zshard {

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
// Checks what needs neither a world nor a device: the dtypes, the timeout, and options of other strategies
// than the one asked for. Throws UsageError naming the option (StrategyOptions::max_inflight; zshard's
// tools name their flags instead). (resolve_plan also checks that this build
// and device can run the placement.)
void validate_plan_options(const PlanOptions& options);

// The resolved plan: every rank of the world holds the same one.
struct ShardPlan {
  StrategyKind kind = StrategyKind::ddp;
  ShardGroupRequest shard_group;  // as asked (--shard-group); `groups` is what it resolved to
  ShardGroups groups{{1}};
  bool reshard_after_forward = true;
  int max_inflight = 2;
  GatherQuantization quantize_gathers = GatherQuantization::none;
  ReductionQuantization quantize_reductions = ReductionQuantization::none;
  // zero3 with --secondary-shard: the groups a unit's share is kept in after its forward, which its
  // backward gathers in (each host's ranks, or groups of N); unset: backward gathers in the shard group.
  std::optional<ShardGroups> secondary_groups;
  Placement placement;
  CommBackend comm = CommBackend::mpi;
  double comm_timeout_s = kDefaultCommTimeout;

  int world_size() const { return groups.world_size(); }
  // Hybrid whose every shard group is one rank (its default on 2, 3 or a prime number of ranks on one host)
  // shards nothing, and runs as ddp: parameters and gradients resident, one all-reduce a step. Sharded
  // groups of one would only copy each unit whole at every gather, and reduce at every micro-step of an
  // accumulation where ddp reduces once (FSDP likewise runs a shard group of one as NO_SHARD).
  bool runs_as_ddp() const { return kind == StrategyKind::hybrid && groups.count() == world_size(); }
  bool params_sharded() const { return zshard::params_sharded(kind) && !runs_as_ddp(); }
  bool grads_sharded() const { return zshard::grads_sharded(kind) && !runs_as_ddp(); }
};

// The plan of `options` on `world`. Collective over `world`, and its first collective: it sets the
// world's timeout before issuing any, agrees that every rank can run the device and backend, then learns
// the hosts (`node` groups, and the default on two or more hosts) and makes this rank's device current (on
// cuda its GPU: local rank modulo the visible GPUs). Throws UsageError naming the option on every rank
// alike for options that do not fit the world or the hosts; a device or backend that some rank cannot run,
// or a device that fails to start, as AgreedFailure on every rank (exit code 2 for the former, reported by
// the first such rank).
ShardPlan resolve_plan(const PlanOptions& options, comm::Communicator& world);
// The plan on `world_size` ranks by arithmetic alone, for a run that is not launched (the estimator,
// zshard-mem): no hosts (`node` is refused), no device.
ShardPlan plan_for_world(const PlanOptions& options, int world_size);
}  // namespace zshard
