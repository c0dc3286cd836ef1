// What zshard's tools and the plan's own code need of it beyond the public API (plan.h): spelling dtypes
// as the flags take them, the deadline set apart from the plan, and the plan of hosts not yet launched
// (and, through strategy_internals.h, the shard groups' sizes).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <zshard/dtype.h>
#include <zshard/strategy.h>

#include "shard/strategy_internals.h"

namespace zshard {

namespace comm {
class Communicator;
}
struct PlanOptions;
struct ShardPlan;

// How --param-dtype and --reduce-dtype spell a dtype: fp32, bf16.
std::string_view dtype_flag(DType dtype);

// Sets `world`'s deadline for every collective from now on to --comm-timeout (when valid; resolve_plan
// refuses it otherwise). Issues none.
void apply_comm_timeout(const PlanOptions& options, comm::Communicator& world);

// `asked` as strategy `kind` takes it: the options of other strategies (hybrid's groups, the gathers'
// depth and modes, the reductions' quantization, the secondary shard) back at their defaults, for tools
// that run or estimate several strategies from one set of flags.
StrategyOptions strategy_options_for(StrategyKind kind, StrategyOptions asked);

// Refuses a communication mode of `asked` (its quantize_gathers, quantize_reductions or secondary_shard)
// that none of `kinds` takes, in validate_plan_options' words for the first of them: the tools that run
// or estimate several strategies from one set of flags give each mode to those that take it.
void check_modes_taken(const std::vector<StrategyKind>& kinds, const StrategyOptions& asked);

// Refuses quantization that the plan's shard groups cannot carry: where every group is one rank nothing
// travels inside a group, so quantized gathers would round the weights for no traffic saved and quantized
// reductions would do nothing. (In unequal groups a group of one still rounds its weights, as the groups
// that gather do.) Where a run starts (the Engine, the trainer's set-up), not where tools plan: zshard-mem
// and zshard-bench size and probe plans that never run. --max-inflight and --reshard-after-forward, which
// hybrid run as ddp ignores, are not refused: a zshard-run relaunch on fewer hosts may make its groups
// one rank each, and must go on.
void check_groups_carry_quantization(const ShardPlan& plan);

// The plan that resolve_plan would make on hosts of `host_sizes` ranks each, in rank order, for a run that
// is not launched yet (zshard-run sizing a relaunch): the hosts' groups for hybrid, no device.
ShardPlan plan_on_hosts(const PlanOptions& options, const std::vector<int>& host_sizes);

// How the launcher placed the world: each host's ranks, in the order of their first rank, and whether every
// host's ranks are consecutive (false: placed round-robin). Collective over `world`.
struct HostLayout {
  std::vector<int> sizes;
  bool consecutive = true;
};
HostLayout host_layout(comm::Communicator& world);

}  // namespace zshard
