// What zshard's tools and the plan's own code need of it beyond the public API (plan.h, strategy.h):
// spelling sizes and dtypes as the flags take them, checking group sizes under the name of whatever gave
// them, the deadline set apart from the plan, and the plan of hosts not yet launched.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <zshard/plan.h>

namespace zshard {

// "4,2": a list of sizes as --shard-group and --nodes take it.
std::string join_sizes(const std::vector<int>& sizes);

// Units are padded to a multiple of every group's size, their least common multiple: up to that many
// elements of padding per unit, and a grid of that many slots for the shard boundaries. Past this bound
// the padding alone would outweigh the models zshard trains.
constexpr int64_t kMaxPadMultiple = int64_t(1) << 20;
// Refuses, with a UsageError naming `what` gave them (an option, a flag, the hosts), group sizes
// ShardGroups cannot take: a size below 1, more ranks in all than an int holds, or a least common
// multiple above kMaxPadMultiple.
void check_group_sizes(const std::vector<int>& sizes, std::string_view what);

// How --param-dtype and --reduce-dtype spell a dtype: fp32, bf16.
std::string_view dtype_flag(DType dtype);

// Sets `world`'s deadline for every collective from now on to --comm-timeout (when valid; resolve_plan
// refuses it otherwise). Issues none.
void apply_comm_timeout(const PlanOptions& options, comm::Communicator& world);

// The plan that resolve_plan would make on hosts of `host_sizes` ranks each, in rank order, for a run that
// is not launched yet (zshard-run sizing a relaunch): the hosts' groups for hybrid, no device.
ShardPlan plan_on_hosts(const PlanOptions& options, const std::vector<int>& host_sizes);

}  // namespace zshard
