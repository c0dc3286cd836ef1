#include <zshard/plan.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include <zshard/error.h>

#include "comm/agreed_failure.h"
#include "comm/launch.h"
#include "shard/device_setup.h"

namespace zshard {

namespace {

// A year: longer is no deadline at all, and far beyond it the deadline's time point would overflow.
constexpr double kMaxCommTimeout = 365.0 * 24 * 3600;

// The hosts of a world in rank order, each a run of consecutive ranks: the size of each.
struct Hosts {
  std::vector<int> sizes;
  bool consecutive = true;  // every host's ranks are consecutive (false: interleaved)
};

// Collective over `world`: each rank's host as launch.h knows it, gathered.
Hosts gather_hosts(comm::Communicator& world) {
  const int n = world.size();
  const int mine[2] = {comm::first_rank_on_this_host(), comm::ranks_on_this_host()};
  std::vector<int> all(size_t(2 * n));
  world.all_gather(mine, all.data(), 2, DType::i32)->wait();
  Hosts hosts;
  for (int r = 0; r < n; ++r) {
    const int first = all[2 * r], size = all[2 * r + 1];
    if (first == r) hosts.sizes.push_back(size);
    hosts.consecutive = hosts.consecutive && first <= r && r < first + size;
  }
  return hosts;
}

// Hybrid's groups on these hosts: `node` becomes the ranks of each host (sizes of their own when the
// hosts differ), and so does the default when the world spans two or more hosts; a list of sizes must
// keep every group inside one host (a group's gathers are what the node link is for).
ShardGroups hybrid_groups_on(const Hosts& hosts, const StrategyOptions& options, int n) {
  if (hosts.consecutive) check_group_sizes(hosts.sizes, "the hosts' ranks");
  const ShardGroupRequest& asked = options.shard_group;
  if (asked.kind() == ShardGroupRequest::Kind::sizes) {
    const ShardGroups list = shard_groups(options, n);  // throws for sizes that miss the world
    if (hosts.sizes.size() < 2 || !hosts.consecutive) return list;
    const ShardGroups on_hosts(hosts.sizes);
    for (int g = 0; g < list.count(); ++g)
      if (on_hosts.group_of(list.first_rank(g)) != on_hosts.group_of(list.first_rank(g) + list.size(g) - 1))
        refuse("--shard-group ", asked.text(), ": a group spans two hosts (the hosts hold ", join_sizes(hosts.sizes),
              " ranks; each group must lie inside one host)");
    return list;
  }
  const bool node_asked = asked.kind() == ShardGroupRequest::Kind::node;
  const StrategyOptions by_size{StrategyKind::hybrid, {}, options.reshard_after_forward, options.max_inflight};
  if (hosts.sizes.size() < 2) {
    if (node_asked)
      refuse("--shard-group node: all ", n, " ranks run on one host (node groups need two or more hosts; give a "
            "group size or a list of sizes instead)");
    return shard_groups(by_size, n);
  }
  if (!hosts.consecutive) {
    if (!node_asked) return shard_groups(by_size, n);  // the size-based default still applies
    refuse("--shard-group node: the hosts hold ", join_sizes(hosts.sizes), " ranks in interleaved rank order; node "
          "groups need each host's ranks to be a run of consecutive ranks");
  }
  const ShardGroups on_hosts(hosts.sizes);
  // One rank per host: nothing to shard inside a node, so the size-based default.
  if (!node_asked && on_hosts.equal() && hosts.sizes[0] == 1) return shard_groups(by_size, n);
  return on_hosts;
}

void check_range(const char* flag, double value, double lo, double hi, const char* note = "") {
  if (!(std::isfinite(value) && value >= lo && value <= hi))
    refuse(flag, " must be a finite number in [", lo, ", ", hi, "]", note, ", got ", value);
}

// What this build and device can run: the backend for the device, and the device itself.
void check_runs_here(const PlanOptions& o) {
  const Device device = o.placement.device;
  if (o.comm == CommBackend::nccl && device == Device::cpu)
    refuse("--comm nccl needs --device cuda (NCCL moves GPU buffers; the cpu uses --comm mpi)");
  if (const std::string why = device_unavailable(device); !why.empty()) refuse("--device ", device_name(device), ": ", why);
}

ShardPlan plan_with_groups(const PlanOptions& options, ShardGroups groups) {
  const StrategyOptions& s = options.strategy;
  return {s.kind, s.shard_group, std::move(groups), s.reshard_after_forward, s.max_inflight, options.placement,
          comm_backend(options), options.comm_timeout_s};
}

}  // namespace

StrategyKind parse_strategy(std::string_view name) {
  if (name == "ddp") return StrategyKind::ddp;
  if (name == "zero1") return StrategyKind::zero1;
  if (name == "zero2") return StrategyKind::zero2;
  if (name == "zero3") return StrategyKind::zero3;
  if (name == "hybrid") return StrategyKind::hybrid;
  refuse("--strategy: unknown strategy '", name, "' (valid: ddp, zero1, zero2, zero3, hybrid)");
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

std::string ShardGroupRequest::text() const {
  switch (kind_) {
    case Kind::automatic: return "auto";
    case Kind::node: return "node";
    case Kind::sizes: return join_sizes(sizes_);
  }
  return "?";
}

namespace {

// The least common multiple of `sizes` (each >= 1), or kMaxPadMultiple + 1 once it passes the bound:
// computed in 64 bits and stopped there, it cannot overflow.
int64_t bounded_lcm(const std::vector<int>& sizes) {
  int64_t lcm = 1;
  for (int g : sizes) {
    lcm = lcm / std::gcd(lcm, int64_t(g)) * g;
    if (lcm > kMaxPadMultiple) return kMaxPadMultiple + 1;
  }
  return lcm;
}

int64_t total(const std::vector<int>& sizes) { return std::accumulate(sizes.begin(), sizes.end(), int64_t{0}); }

}  // namespace

void check_group_sizes(const std::vector<int>& sizes, std::string_view flag) {
  for (int g : sizes)
    if (g < 1) refuse(flag, ": group sizes must be >= 1, got ", g);
  if (total(sizes) > INT_MAX) refuse(flag, ": ", total(sizes), " ranks in all, more than ", INT_MAX);
  if (bounded_lcm(sizes) > kMaxPadMultiple)
    refuse(flag, " ", join_sizes(sizes), ": every unit is padded to a multiple of each group's size, and the least "
           "common multiple of these exceeds ", kMaxPadMultiple,
           "; choose sizes with a smaller common multiple (groups of one size need none)");
}

ShardGroups::ShardGroups(std::vector<int> sizes) : sizes_(std::move(sizes)), first_{0} {
  ZS_CHECK(!sizes_.empty(), "a world has at least one shard group");
  for (int g : sizes_) ZS_CHECK(g >= 1, "shard groups hold at least one rank, got ", g);
  ZS_CHECK(total(sizes_) <= INT_MAX && bounded_lcm(sizes_) <= kMaxPadMultiple, "shard groups of sizes ",
           join_sizes(sizes_), ": too many ranks, or a least common multiple above ", kMaxPadMultiple);
  for (int g : sizes_) first_.push_back(first_.back() + g);
  pad_multiple_ = int(bounded_lcm(sizes_));
}

int ShardGroups::group_of(int rank) const {
  ZS_CHECK(rank >= 0 && rank < world_size(), "rank ", rank, " outside a world of ", world_size());
  return int(std::upper_bound(first_.begin(), first_.end(), rank) - first_.begin()) - 1;
}

bool ShardGroups::equal() const {
  return std::all_of(sizes_.begin(), sizes_.end(), [&](int g) { return g == sizes_[0]; });
}

std::string join_sizes(const std::vector<int>& sizes) {
  std::string list;
  for (int g : sizes) {
    if (!list.empty()) list += ',';
    list += std::to_string(g);
  }
  return list;
}

std::string ShardGroups::describe() const { return equal() ? std::to_string(sizes_[0]) : join_sizes(sizes_); }

ShardGroups shard_groups(const StrategyOptions& options, int world_size) {
  switch (options.kind) {
    case StrategyKind::ddp: return ShardGroups(std::vector<int>(size_t(world_size), 1));
    case StrategyKind::zero1:
    case StrategyKind::zero2:
    case StrategyKind::zero3: return ShardGroups({world_size});
    case StrategyKind::hybrid: break;
  }
  const ShardGroupRequest& asked = options.shard_group;
  if (asked.kind() == ShardGroupRequest::Kind::node)
    refuse("--shard-group node: the hosts decide node groups, and this plan has none (give the nodes' sizes, "
          "e.g. 4,2)");
  if (asked.sizes().size() > 1) {
    const std::vector<int>& sizes = asked.sizes();
    check_group_sizes(sizes, "--shard-group");
    if (total(sizes) != world_size)
      refuse("--shard-group ", join_sizes(sizes), ": the groups hold ", total(sizes), " ranks, the world has ",
             world_size);
    return ShardGroups(sizes);
  }
  const int g = asked.automatic() ? default_shard_group(world_size) : asked.sizes()[0];
  if (g < 1 || world_size % g != 0)
    refuse("--shard-group ", g, " does not divide the world size ", world_size,
          " (hybrid needs groups of G consecutive ranks; give unequal groups as a list of sizes, e.g. 4,2)");
  return ShardGroups(std::vector<int>(size_t(world_size / g), g));
}

int shard_group_size(const StrategyOptions& options, int world_size) {
  const ShardGroups groups = shard_groups(options, world_size);
  if (!groups.equal()) refuse("--shard-group ", groups.describe(), ": this needs groups of one size");
  return groups.size(0);
}

int default_shard_group(int world_size, int node_ranks) {
  for (int g = std::min(node_ranks, world_size / 2); g > 1; --g)
    if (world_size % g == 0) return g;
  return 1;
}

std::string_view dtype_flag(DType dtype) { return dtype == DType::f32 ? "fp32" : dtype_name(dtype); }

CommBackend comm_backend(const PlanOptions& o) {
  return o.comm.value_or(o.placement.device == Device::cuda ? CommBackend::nccl : CommBackend::mpi);
}

void validate_plan_options(const PlanOptions& o) {
  for (const auto& [flag, dtype] : {std::pair{"--param-dtype", o.placement.param_dtype},
                                    std::pair{"--reduce-dtype", o.placement.reduce_dtype}})
    if (dtype != DType::f32 && dtype != DType::bf16) refuse(flag, " must be fp32 or bf16, got ", dtype_flag(dtype));
  check_range("--comm-timeout", o.comm_timeout_s, 1e-3, kMaxCommTimeout, " seconds");
  const StrategyOptions& s = o.strategy;
  if (s.max_inflight < 1) refuse("--max-inflight must be >= 1, got ", s.max_inflight);
  // The other strategies keep whole parameters: there is nothing to gather, and these would do nothing.
  if (!params_sharded(s.kind)) {
    const StrategyOptions defaults;
    if (s.max_inflight != defaults.max_inflight) refuse("--max-inflight is only for --strategy zero3 or hybrid");
    if (s.reshard_after_forward != defaults.reshard_after_forward)
      refuse("--reshard-after-forward is only for --strategy zero3 or hybrid");
  }
  if (s.kind != StrategyKind::hybrid && !s.shard_group.automatic()) refuse("--shard-group is only for --strategy hybrid");
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
  check_runs_here(options);
  const Device device = options.placement.device;
  // Hybrid's groups depend on the hosts, except where one size was given.
  const ShardGroupRequest& asked = options.strategy.shard_group;
  const bool one_size = asked.kind() == ShardGroupRequest::Kind::sizes && asked.sizes().size() == 1;
  ShardPlan plan = options.strategy.kind == StrategyKind::hybrid && !one_size
                       ? plan_with_groups(options, hybrid_groups_on(gather_hosts(world), options.strategy, world.size()))
                       : plan_for_world(options, world.size());
  if (device != Device::cpu) run_agreed(world, [&] { select_device(device, world); });
  return plan;
}

ShardPlan plan_on_hosts(const PlanOptions& options, const std::vector<int>& host_sizes) {
  validate_plan_options(options);
  int world = 0;
  for (int h : host_sizes) world += h;
  if (options.strategy.kind != StrategyKind::hybrid) return plan_for_world(options, world);
  return plan_with_groups(options, hybrid_groups_on({host_sizes, true}, options.strategy, world));
}

ShardPlan plan_for_world(const PlanOptions& options, int world_size) {
  validate_plan_options(options);
  return plan_with_groups(options, shard_groups(options.strategy, world_size));
}

}  // namespace zshard
