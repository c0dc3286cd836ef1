// The flags of the sharding plan (<zshard/plan.h>): --strategy, --shard-group, --reshard-after-forward,
// --max-inflight, --quantize-gathers, --quantize-reductions, --secondary-shard, --device, --param-dtype,
// --reduce-dtype, --comm, --offload, --comm-timeout. The plan checks its own values (validate_plan_options, resolve_plan).
#pragma once
#include <string>
#include <vector>

#include <zshard/plan.h>

#include "runtime/cli/cli_fwd.h"

namespace zshard {

// --shard-group G | G1,G2,... | node: hybrid's groups.
void add_shard_group_flag(CLI::App& app, ShardGroupRequest& request);
// --device cpu|cuda: where the run computes (zshard-mem: where it would).
void add_device_flag(CLI::App& app, Device& device, const std::string& help);
// --offload none|optimizer: zshard-train, zshard-bench and zshard-mem.
void add_offload_flag(CLI::App& app, bool& offload_optimizer);
// --quantize-gathers, --quantize-reductions and --secondary-shard: how the strategies' collectives travel
// (zshard-train, zshard-bench and zshard-mem).
void add_comm_mode_flags(CLI::App& app, StrategyOptions& strategy);
// --reshard-after-forward and --reduce-dtype, as zshard-train takes them (zshard-mem's estimates too).
void add_reshard_flag(CLI::App& app, bool& reshard_after_forward);
void add_reduce_dtype_flag(CLI::App& app, DType& reduce_dtype);
// The strategies' names, as --strategy takes them and the tools' lists (--strategies) do.
const std::vector<std::string>& strategy_names();
// All of them, --strategy by name.
void add_plan_flags(CLI::App& app, PlanOptions& options);

}  // namespace zshard
