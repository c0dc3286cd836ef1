#include <zshard/plan.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <zshard/error.h>

#include "comm/agreed_failure.h"
#include "comm/launch.h"
#include "kernels/option_names.h"
#include "shard/device_setup.h"
#include "shard/plan_internals.h"

namespace zshard {

namespace {

// A year: longer is no deadline at all, and far beyond it the deadline's time point would overflow.
constexpr double kMaxCommTimeout = 365.0 * 24 * 3600;

}  // namespace

// Each rank's host as launch.h knows it, gathered.
HostLayout host_layout(comm::Communicator& world) {
  const int n = world.size();
  const int mine[2] = {comm::first_rank_on_this_host(), comm::ranks_on_this_host()};
  std::vector<int> all(size_t(2 * n));
  world.all_gather(mine, all.data(), 2, DType::i32)->wait();
  HostLayout hosts;
  for (int r = 0; r < n; ++r) {
    const int first = all[2 * r], size = all[2 * r + 1];
    if (first == r) hosts.sizes.push_back(size);
    hosts.consecutive = hosts.consecutive && first <= r && r < first + size;
  }
  return hosts;
}

namespace {

// Hybrid's groups on these hosts: `node` becomes the ranks of each host (sizes of their own when the
// hosts differ), and so does the default when the world spans two or more hosts; a list of sizes must
// keep every group inside one host (a group's gathers are what the node link is for).
ShardGroups hybrid_groups_on(const HostLayout& hosts, const StrategyOptions& options, int n) {
  if (hosts.consecutive) check_group_sizes(hosts.sizes, "the hosts' ranks");
  const ShardGroupRequest& asked = options.shard_group;
  if (asked.kind() == ShardGroupRequest::Kind::sizes) {
    const ShardGroups list = shard_groups(options, n);  // throws for sizes that miss the world
    if (hosts.sizes.size() < 2 || !hosts.consecutive) return list;
    const ShardGroups on_hosts(hosts.sizes);
    for (int g = 0; g < list.count(); ++g)
      if (on_hosts.group_of(list.first_rank(g)) != on_hosts.group_of(list.first_rank(g) + list.size(g) - 1))
        refuse(option_name(Option::shard_group), " ", asked.text(), ": a group spans two hosts (the hosts hold ", join_sizes(hosts.sizes),
              " ranks; each group must lie inside one host)");
    return list;
  }
  const bool node_asked = asked.kind() == ShardGroupRequest::Kind::node;
  const StrategyOptions by_size{StrategyKind::hybrid, {}, options.reshard_after_forward, options.max_inflight};
  if (hosts.sizes.size() < 2) {
    if (node_asked)
      refuse(option_name(Option::shard_group), " node: all ", n, " ranks run on one host (node groups need two or more hosts; give a "
            "group size or a list of sizes instead)");
    return shard_groups(by_size, n);
  }
  if (!hosts.consecutive) {
    if (!node_asked) return shard_groups(by_size, n);  // the size-based default still applies
    refuse(option_name(Option::shard_group), " node: the hosts hold ", join_sizes(hosts.sizes), " ranks in interleaved rank order; node "
          "groups need each host's ranks to be a run of consecutive ranks");
  }
  const ShardGroups on_hosts(hosts.sizes);
  // One rank per host: nothing to shard inside a node, so the size-based default; node groups asked for
  // would each be one rank, which is ddp under another name.
  if (on_hosts.equal() && hosts.sizes[0] == 1) {
    if (node_asked)
      refuse(option_name(Option::shard_group), " node: every one of the ", n, " hosts holds one rank, so each node group "
            "would be one rank, which is ddp (give a group size, which spans hosts, or use ddp)");
    return shard_groups(by_size, n);
  }
  return on_hosts;
}

// Every digit a double needs (the stream's 6 would print 31536001 as 3.1536e+07, the bound it passed).
std::string shortest(double value) {
  char text[32];
  return std::string(text, std::to_chars(text, text + sizeof text, value).ptr);
}

void check_range(std::string_view flag, double value, double lo, double hi, const char* note = "") {
  if (!(std::isfinite(value) && value >= lo && value <= hi))
    refuse(flag, " must be a finite number in [", shortest(lo), ", ", shortest(hi), "]", note, ", got ", shortest(value));
}

// What this build and device can run: the backend for the device, and the device itself.
void check_runs_here(const PlanOptions& o) {
  const Device device = o.placement.device;
  if (o.comm == CommBackend::nccl && device == Device::cpu)
    refuse(option_setting(Option::comm, "nccl", "CommBackend::nccl"), " needs ",
           option_setting(Option::device, "cuda", "Device::cuda"), " (NCCL moves GPU buffers; the cpu uses ",
           option_setting(Option::comm, "mpi", "CommBackend::mpi"), ")");
  if (const std::string why = device_unavailable(device); !why.empty()) refuse(option_name(Option::device), " ", device_name(device), ": ", why);
}

ShardPlan plan_with_groups(const PlanOptions& options, ShardGroups groups,
                           std::optional<ShardGroups> secondary_groups = std::nullopt) {
  const StrategyOptions& s = options.strategy;
  return {s.kind,          s.shard_group,       std::move(groups),         s.reshard_after_forward,
          s.max_inflight,  s.quantize_gathers,  s.quantize_reductions,     std::move(secondary_groups),
          options.placement, comm_backend(options), options.comm_timeout_s};
}

// zero3's secondary groups of N consecutive ranks (--secondary-shard N) on a world of n.
ShardGroups secondary_groups_of_size(int size, int n) {
  if (n % size != 0)
    refuse(option_name(Option::secondary_shard), " ", size, " does not divide the world size ", n,
           " (secondary groups are runs of N consecutive ranks)");
  if (size == n)
    refuse(option_name(Option::secondary_shard), " ", size, ": a secondary group of the whole world is the shard group "
           "itself, which is ", option_setting(Option::reshard_after_forward, "true", "true"));
  return ShardGroups(std::vector<int>(size_t(n / size), size));
}

// zero3's secondary groups on these hosts (--secondary-shard host): each host's ranks. On one host they
// would be the shard group itself, so there are none: the run is plain zero3, as the same command on a
// cluster's single node should be.
std::optional<ShardGroups> secondary_groups_on(const HostLayout& hosts) {
  const std::string_view flag = option_name(Option::secondary_shard);
  if (hosts.sizes.size() < 2) return std::nullopt;
  if (!hosts.consecutive)
    refuse(flag, " host: the hosts hold ", join_sizes(hosts.sizes), " ranks in interleaved rank order; secondary "
           "groups need each host's ranks to be a run of consecutive ranks");
  if (std::all_of(hosts.sizes.begin(), hosts.sizes.end(), [](int h) { return h == 1; }))
    refuse(flag, " host: every host runs one rank, so each would keep whole units from forward to backward, which is ",
           option_setting(Option::reshard_after_forward, "false", "false"));
  check_group_sizes(hosts.sizes, "the hosts' ranks");
  return ShardGroups(hosts.sizes);
}

// The secondary groups asked for, by arithmetic where a size was given, from `hosts` otherwise (null:
// no hosts known, which refuses `host`).
std::optional<ShardGroups> secondary_groups(const StrategyOptions& s, int n, const HostLayout* hosts) {
  switch (s.secondary_shard.kind) {
    case SecondaryShard::Kind::none: return std::nullopt;
    case SecondaryShard::Kind::size: return secondary_groups_of_size(s.secondary_shard.size, n);
    case SecondaryShard::Kind::host: break;
  }
  if (!hosts)
    refuse(option_name(Option::secondary_shard), " host: the hosts decide host groups, and this plan has none (give "
           "the ranks per host, e.g. 8)");
  return secondary_groups_on(*hosts);
}

}  // namespace

std::string_view dtype_flag(DType dtype) { return dtype == DType::f32 ? "fp32" : dtype_name(dtype); }

CommBackend comm_backend(const PlanOptions& o) {
  return o.comm.value_or(o.placement.device == Device::cuda ? CommBackend::nccl : CommBackend::mpi);
}

void validate_plan_options(const PlanOptions& o) {
  for (const auto& [option, dtype] : {std::pair{Option::param_dtype, o.placement.param_dtype},
                                      std::pair{Option::reduce_dtype, o.placement.reduce_dtype}})
    if (dtype != DType::f32 && dtype != DType::bf16) refuse(option_name(option), " must be fp32 or bf16, got ", dtype_flag(dtype));
  check_range(option_name(Option::comm_timeout), o.comm_timeout_s, 1e-3, kMaxCommTimeout, " seconds");
  const StrategyOptions& s = o.strategy;
  if (s.max_inflight < 1) refuse(option_name(Option::max_inflight), " must be >= 1, got ", s.max_inflight);
  // The other strategies keep whole parameters: there is nothing to gather, and these would do nothing.
  if (!params_sharded(s.kind)) {
    const StrategyOptions defaults;
    const std::string only = detail::concat(" is only for ", option_name(Option::strategy), " zero3 or hybrid");
    if (s.max_inflight != defaults.max_inflight) refuse(option_name(Option::max_inflight), only);
    if (s.reshard_after_forward != defaults.reshard_after_forward) refuse(option_name(Option::reshard_after_forward), only);
    if (s.quantize_gathers != defaults.quantize_gathers) refuse(option_name(Option::quantize_gathers), only);
  }
  if (s.secondary_shard.kind != SecondaryShard::Kind::none) {
    const std::string_view flag = option_name(Option::secondary_shard);
    if (s.kind == StrategyKind::hybrid)
      refuse(flag, " is only for ", option_name(Option::strategy), " zero3 (hybrid's gathers already stay inside its "
             "shard group: give ", option_name(Option::shard_group), " the secondary group's size instead)");
    if (s.kind != StrategyKind::zero3) refuse(flag, " is only for ", option_name(Option::strategy), " zero3");
    if (!s.reshard_after_forward)
      refuse(flag, " needs ", option_setting(Option::reshard_after_forward, "true", "true"),
             ": without resharding the whole unit is kept from forward to backward, and there is nothing to partition");
  }
  // ddp's all-reduce leaves every rank the whole sum: there is no owner to sum the quantized chunks in fp32.
  if (s.kind == StrategyKind::ddp && s.quantize_reductions != ReductionQuantization::none)
    refuse(option_name(Option::quantize_reductions), " is only for ", option_name(Option::strategy),
           " zero1, zero2, zero3 or hybrid (ddp all-reduces: no rank owns a shard to sum)");
  if (s.kind != StrategyKind::hybrid && !s.shard_group.automatic())
    refuse(option_name(Option::shard_group), " is only for ", option_name(Option::strategy), " hybrid");
}

void apply_comm_timeout(const PlanOptions& options, comm::Communicator& world) {
  const double s = options.comm_timeout_s;
  if (std::isfinite(s) && s >= 1e-3 && s <= kMaxCommTimeout)
    world.set_timeout(std::chrono::duration_cast<comm::Clock::duration>(std::chrono::duration<double>(s)));
}

ShardPlan resolve_plan(const PlanOptions& options, comm::Communicator& world) {
  // The timeout first: every collective from here on, set-up's included, ends at the deadline.
  apply_comm_timeout(options, world);
  comm::maybe_stall_in_set_up(world.rank(), "plan");
  // Each step below fails alike on every rank (the same options, the same gathered hosts) or is agreed.
  validate_plan_options(options);
  // Agreed: a rank without the device would refuse alone while its peers went on into the collectives below.
  run_agreed(world, [&] { check_runs_here(options); });
  const Device device = options.placement.device;
  // Hybrid's groups depend on the hosts, except where one size was given.
  const ShardGroupRequest& asked = options.strategy.shard_group;
  const bool one_size = asked.kind() == ShardGroupRequest::Kind::sizes && asked.sizes().size() == 1;
  ShardPlan plan;
  if (options.strategy.kind == StrategyKind::hybrid && !one_size) {
    plan = plan_with_groups(options, hybrid_groups_on(host_layout(world), options.strategy, world.size()));
  } else if (options.strategy.secondary_shard.kind == SecondaryShard::Kind::host) {
    const HostLayout hosts = host_layout(world);
    plan = plan_with_groups(options, shard_groups(options.strategy, world.size()),
                            secondary_groups(options.strategy, world.size(), &hosts));
  } else {
    plan = plan_for_world(options, world.size());
  }
  if (device != Device::cpu) run_agreed(world, [&] { select_device(device, world); });
  return plan;
}

StrategyOptions strategy_options_for(StrategyKind kind, StrategyOptions s) {
  const StrategyOptions defaults;
  s.kind = kind;
  if (kind != StrategyKind::hybrid) s.shard_group = defaults.shard_group;
  if (!params_sharded(kind)) {
    s.max_inflight = defaults.max_inflight;
    s.reshard_after_forward = defaults.reshard_after_forward;
    s.quantize_gathers = defaults.quantize_gathers;
  }
  if (kind == StrategyKind::ddp) s.quantize_reductions = defaults.quantize_reductions;
  if (kind != StrategyKind::zero3) s.secondary_shard = defaults.secondary_shard;
  return s;
}

void check_modes_taken(const std::vector<StrategyKind>& kinds, const StrategyOptions& asked) {
  StrategyOptions gathers, reductions, secondary;
  gathers.quantize_gathers = asked.quantize_gathers;
  reductions.quantize_reductions = asked.quantize_reductions;
  secondary.secondary_shard = asked.secondary_shard;
  for (const StrategyOptions& mode : {gathers, reductions, secondary}) {
    const auto asked_of = [&](StrategyKind kind) {
      PlanOptions o;
      o.strategy = mode;
      o.strategy.kind = kind;
      return o;
    };
    const auto takes = [&](StrategyKind kind) {
      try {
        validate_plan_options(asked_of(kind));
        return true;
      } catch (const UsageError&) {
        return false;
      }
    };
    if (!kinds.empty() && std::none_of(kinds.begin(), kinds.end(), takes)) validate_plan_options(asked_of(kinds.front()));
  }
}

ShardPlan plan_on_hosts(const PlanOptions& options, const std::vector<int>& host_sizes) {
  validate_plan_options(options);
  int world = 0;
  for (int h : host_sizes) world += h;
  const HostLayout hosts{host_sizes, true};
  if (options.strategy.kind == StrategyKind::hybrid)
    return plan_with_groups(options, hybrid_groups_on(hosts, options.strategy, world));
  return plan_with_groups(options, shard_groups(options.strategy, world),
                          secondary_groups(options.strategy, world, &hosts));
}

ShardPlan plan_for_world(const PlanOptions& options, int world_size) {
  validate_plan_options(options);
  return plan_with_groups(options, shard_groups(options.strategy, world_size),
                          secondary_groups(options.strategy, world_size, nullptr));
}

void check_groups_carry_quantization(const ShardPlan& plan) {
  const ShardGroups& groups = plan.groups;
  const std::vector<int>& sizes = groups.sizes();
  if (std::any_of(sizes.begin(), sizes.end(), [](int size) { return size > 1; })) return;
  const std::string alone = detail::concat(": every shard group here is one rank (", groups.world_size(),
                                           groups.world_size() == 1 ? " rank" : " ranks in groups of 1",
                                           "), so nothing is ");
  if (plan.quantize_gathers != GatherQuantization::none)
    refuse(option_name(Option::quantize_gathers), " ", gather_quantization_name(plan.quantize_gathers), alone,
           "gathered from another rank: the weights would be rounded for no traffic saved");
  if (plan.quantize_reductions != ReductionQuantization::none)
    refuse(option_name(Option::quantize_reductions), " ", reduction_quantization_name(plan.quantize_reductions), alone,
           "reduce-scattered inside a group: the flag would do nothing");
}


}  // namespace zshard
