#include "shard/memory/fit_check.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>

#include <zshard/error.h>

#include "kernels/option_names.h"
#include "shard/memory/divisors.h"
#include "shard/memory/estimator.h"
#include "shard/device_setup.h"

namespace zshard {

namespace {

// A number from a /proc or /sys file; -1 when absent or not a number ("max" in a cgroup file).
int64_t read_number(const std::string& path, const std::string& key = "") {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!key.empty() && line.rfind(key, 0) != 0) continue;
    std::istringstream fields(line.substr(key.size()));
    int64_t value = -1;
    if (fields >> value) return value;
    return -1;
  }
  return -1;
}

// The setting that moves a run to `kind`; a hybrid run's shard groups must go with it.
std::string switch_to(const ShardPlan& plan, StrategyKind kind) {
  const std::string_view name = strategy_name(kind);
  return detail::concat(option_setting(Option::strategy, name, "StrategyKind::" + std::string(name)),
                        plan.shard_group.automatic() ? "" : " (without ",
                        plan.shard_group.automatic() ? "" : option_name(Option::shard_group),
                        plan.shard_group.automatic() ? "" : ")");
}

// A micro-batch cut that keeps the global batch: `batch` sequences per micro-step, `grad_accum` of them.
std::string batch_split(int64_t batch, int64_t grad_accum) {
  const std::string b = std::to_string(batch), g = std::to_string(grad_accum);
  return detail::concat(option_setting(Option::batch, b, b), " ", option_setting(Option::grad_accum, g, g));
}

// How the tools' user skips the check (a program of its own just does not call it).
std::string skip_hint() {
  if (option_naming() != OptionNaming::flags) return "";
  return " (" + option_setting(Option::mem_check, "off", "off") + " skips this check)";
}

// The run's plan under `kind` on `world` ranks: its own where nothing changes, else the default groups and
// prefetch of that strategy with the run's placement.
ShardPlan plan_as(const ShardPlan& plan, StrategyKind kind, int world) {
  if (kind == plan.kind && world == plan.world_size()) return plan;
  PlanOptions options;
  options.strategy.kind = kind;
  options.placement = plan.placement;
  options.comm = plan.comm;
  options.comm_timeout_s = plan.comm_timeout_s;
  if (params_sharded(kind) && params_sharded(plan.kind)) {
    options.strategy.max_inflight = plan.max_inflight;
    options.strategy.reshard_after_forward = plan.reshard_after_forward;
  }
  return plan_for_world(options, world);
}

bool fits(const EstimateInput& in, int64_t budget) {
  try {
    return estimate_memory(in).total() <= budget;
  } catch (const UsageError&) {
    return false;  // the strategy does not apply to this world (a shard group that does not divide it)
  }
}

// What a suggestion that splits the micro-batch evenly adds for a run of uneven --rank-batches.
std::string without_rank_batches(const BatchShape& shape) {
  return shape.even ? "" : detail::concat("without ", option_name(Option::rank_batches));
}

// Parts of a suggestion, a space between those that say something.
std::string joined(const std::string& a, const std::string& b) { return a.empty() || b.empty() ? a + b : a + " " + b; }

// The first configuration that fits: this strategy, then each that shards more; for each, the smallest
// cut of the micro-batch (a divisor of --batch, times more --grad-accum, so the global batch stays). Uneven
// --rank-batches are tried as they are, then split evenly.
std::string nearest_fit(const ShardPlan& plan, const Model& model, const BatchShape& shape, int largest_rank_batch,
                        int64_t budget) {
  const int world = plan.world_size();
  std::vector<StrategyKind> kinds = {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2,
                                     StrategyKind::zero3};
  if (plan.kind == StrategyKind::hybrid) kinds = {StrategyKind::hybrid, StrategyKind::zero3};
  else kinds.erase(kinds.begin(), std::find(kinds.begin(), kinds.end(), plan.kind));
  for (StrategyKind kind : kinds) {
    const std::string strategy = kind == plan.kind ? "" : switch_to(plan, kind);
    const ShardPlan candidate = plan_as(plan, kind, world);
    if (!shape.even && fits(estimate_input(candidate, model, shape, largest_rank_batch), budget)) return strategy;
    for (int cut : divisors(shape.batch)) {
      if (shape.batch / cut < world || int64_t(shape.grad_accum) * cut > std::numeric_limits<int>::max()) break;
      const int rank_batch = cut == 1 && shape.even ? largest_rank_batch : (shape.batch / cut + world - 1) / world;
      EstimateInput in = estimate_input(candidate, model, shape, rank_batch);
      in.grad_accum = shape.grad_accum * cut;
      if (!fits(in, budget)) continue;
      if (cut == 1) return joined(strategy, without_rank_batches(shape));
      const std::string split = batch_split(shape.batch / cut, int64_t(shape.grad_accum) * cut);
      return joined(joined(strategy, split), without_rank_batches(shape)) + " (the same global batch)";
    }
  }
  return "";
}

// The divisors of the global batch that can be a micro-batch (up to INT_MAX), in increasing order.
std::vector<int64_t> micro_batches(int64_t global) {
  std::vector<int64_t> found = divisors(global);
  std::erase_if(found, [](int64_t d) { return d > std::numeric_limits<int>::max(); });
  return found;
}

// When nothing fits on this world: the fewest ranks, each with this rank's memory, on which zero3 would,
// with the global batch cut into the smallest micro-batch that gives every rank a sequence.
std::string more_ranks(const ShardPlan& plan, const Model& model, const BatchShape& shape, int64_t budget) {
  const int64_t global = int64_t(shape.batch) * shape.grad_accum;
  const std::vector<int64_t> batches = micro_batches(global);
  for (int ranks = plan.world_size() * 2; ranks <= (1 << 16); ranks *= 2) {
    const auto batch = std::lower_bound(batches.begin(), batches.end(), int64_t(ranks));
    if (batch == batches.end()) break;  // fewer sequences than ranks
    if (global / *batch > std::numeric_limits<int>::max()) continue;
    EstimateInput in = estimate_input(plan_as(plan, StrategyKind::zero3, ranks), model, shape, int((*batch + ranks - 1) / ranks));
    in.grad_accum = int(global / *batch);
    if (!fits(in, budget)) continue;
    const bool same = *batch == shape.batch;
    return joined(detail::concat(switch_to(plan, StrategyKind::zero3), " on ", ranks, " ranks with this much memory each",
                                 same ? "" : " (" + batch_split(*batch, global / *batch) + ")"),
                  without_rank_batches(shape));
  }
  return "";
}

}  // namespace

EstimateInput estimate_input(const ShardPlan& plan, const Model& model, const BatchShape& shape, int rank_batch) {
  EstimateInput in;
  in.model = &model;
  in.plan = plan;
  in.rank_batch = rank_batch;
  in.seq = shape.seq;
  in.grad_accum = shape.grad_accum;
  in.checkpoint_snapshot = shape.checkpoint_snapshot;
  in.freeze = shape.freeze;
  in.imports_weights = shape.imports_weights;
  return in;
}

MemoryBudget usable_memory(Device device, int ranks_on_host) {
  MemoryBudget budget;
  const int share = std::max(1, ranks_on_host);
  const std::string ranks = detail::concat(" shared by ", share, " rank", share > 1 ? "s" : "", " on this host");
  if (device != Device::cpu) {
    const int64_t free = device_free_memory_per_rank(device, share);
    if (free >= 0) budget = {free, detail::concat("free ", device_name(device), " memory per rank sharing the device")};
    return budget;
  }
  const int64_t available_kib = read_number("/proc/meminfo", "MemAvailable:");
  int64_t total = available_kib >= 0 ? available_kib * 1024 : -1;
  std::string source = "MemAvailable";
  // A container's limit: cgroup v2, else v1 (whose "no limit" is a huge number, larger than the host).
  for (const auto& [limit_file, usage_file] : {std::pair{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
                                               std::pair{"/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                                         "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const int64_t limit = read_number(limit_file), used = read_number(usage_file);
    if (limit < 0 || used < 0) continue;
    if (total < 0 || limit - used < total) {
      total = std::max<int64_t>(0, limit - used);
      source = "the cgroup limit's remaining";
    }
    break;
  }
  if (total < 0) return budget;
  return {total / share, detail::concat(source, " ", format_bytes(double(total)), ranks)};
}

int largest_rank_batch_fitting(const ShardPlan& plan, const Model& model, const BatchShape& shape,
                               const MemoryBudget& budget) {
  if (budget.bytes < 0) return -1;
  return largest_rank_batch(estimate_input(plan, model, shape, 1), budget.bytes);
}

void check_host_memory_fits(const ShardPlan& plan, const Model& model, const BatchShape& shape,
                            const MemoryBudget& host_budget) {
  const bool offload = plan.placement.offload_optimizer, snapshot = shape.checkpoint_snapshot;
  if (host_budget.bytes < 0 || plan.placement.device == Device::cpu || (!offload && !snapshot)) return;
  // The most any rank needs: the device's worst rank, or group 0's, which alone holds the snapshot.
  const auto host_of = [&](const ShardPlan& p) {
    EstimateInput in = estimate_input(p, model, shape, 1);
    const int64_t worst_device_rank = estimate_memory(in).host_apart();
    in.group = 0;
    return std::max(worst_device_rank, estimate_memory(in).host_apart());
  };
  const int64_t host = host_of(plan);
  if (host <= host_budget.bytes) return;
  // The host bytes shrink only with the shard group: hybrid's shards more as zero3, any strategy's with
  // more ranks.
  const int world = plan.world_size();
  std::string fix;
  if (plan.kind == StrategyKind::hybrid && host_of(plan_as(plan, StrategyKind::zero3, world)) <= host_budget.bytes)
    fix = switch_to(plan, StrategyKind::zero3);
  for (int ranks = world * 2; fix.empty() && ranks <= (1 << 16); ranks *= 2)
    if (host_of(plan_as(plan, StrategyKind::zero3, ranks)) <= host_budget.bytes)
      fix = detail::concat(switch_to(plan, StrategyKind::zero3), " on ", ranks, " ranks with this much host memory each");
  const std::string offloaded = option_setting(Option::offload, "optimizer", "true");
  const std::string async_snapshot = "the snapshot of " + option_setting(Option::save_mode, "async", "async");
  const std::string what = !snapshot ? offloaded : offload ? offloaded + " with " + async_snapshot : async_snapshot;
  fail(what, " does not fit in host memory: this rank needs about ", format_bytes(double(host)),
       " of page-locked host memory, it can use ", format_bytes(double(host_budget.bytes)), " (",
       host_budget.source, "); ", fix.empty() ? "" : "nearest that fits: " + fix + ", or ",
       offload ? option_setting(Option::offload, "none", "false") : "", offload && snapshot ? " and " : "",
       snapshot ? option_setting(Option::save_mode, "sync", "sync") : "", skip_hint());
}

void check_memory_fits(const ShardPlan& plan, const Model& model, const BatchShape& shape, int rank_batch,
                       int largest_rank_batch, const MemoryBudget& budget) {
  if (budget.bytes < 0) return;
  const MemoryEstimate e = estimate_memory(estimate_input(plan, model, shape, rank_batch));
  if (e.total() <= budget.bytes) return;
  const int world = plan.world_size();
  const std::string fix = nearest_fit(plan, model, shape, largest_rank_batch, budget.bytes);
  const std::string bigger = fix.empty() ? more_ranks(plan, model, shape, budget.bytes) : "";
  fail("does not fit in memory: this rank needs about ", format_bytes(double(e.total())), " (model states ",
       format_bytes(double(e.model_states.total() - e.host_apart())), ", activations ",
       format_bytes(double(e.activations)),
       e.set_up > e.step_total() ? ", set-up's peak, a unit staged in fp32 beside the states" : "",
       "), it can use ", format_bytes(double(budget.bytes)), " (", budget.source, "); ",
       !fix.empty()    ? "nearest that fits: " + fix
       : bigger.empty() ? detail::concat("no strategy or batch split fits on ", world, " rank(s) or on more of them")
                        : detail::concat("nothing fits on ", world, " rank(s); nearest that fits: ", bigger),
       skip_hint());
}

}  // namespace zshard
