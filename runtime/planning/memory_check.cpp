#include "runtime/planning/memory_check.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>

#include <zshard/error.h>

#include "runtime/planning/memory_estimator.h"
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

// The flag that moves a run to `kind`; a hybrid run's --shard-group must go with it.
std::string switch_to(const TrainOptions& o, StrategyKind kind) {
  const bool groups = o.strategy.shard_group != 0 || !o.strategy.shard_group_sizes.empty();
  return detail::concat("--strategy ", strategy_name(kind), groups ? " (without --shard-group)" : "");
}

bool fits(const EstimateInput& in, int64_t budget) {
  try {
    return estimate_memory(in).total() <= budget;
  } catch (const UsageError&) {
    return false;  // the strategy does not apply to this world (a shard group that does not divide it)
  }
}

// The divisors of n in increasing order, found in O(sqrt(n)): --batch may be close to 2^31.
std::vector<int> divisors(int n) {
  std::vector<int> low, high;
  for (int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    low.push_back(int(d));
    if (d * d != n) high.push_back(int(n / d));
  }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

// The first configuration that fits: this strategy, then each that shards more; for each, the smallest
// cut of the micro-batch (a divisor of --batch, times more --grad-accum, so the global batch stays).
std::string nearest_fit(const TrainOptions& o, const Model& model, int world, int largest_rank_batch,
                        int64_t budget) {
  std::vector<StrategyKind> kinds = {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2,
                                     StrategyKind::zero3};
  if (o.strategy.kind == StrategyKind::hybrid) kinds = {StrategyKind::hybrid, StrategyKind::zero3};
  else kinds.erase(kinds.begin(), std::find(kinds.begin(), kinds.end(), o.strategy.kind));
  for (StrategyKind kind : kinds) {
    const std::string strategy = kind == o.strategy.kind ? "" : switch_to(o, kind);
    for (int cut : divisors(o.batch)) {
      if (o.batch / cut < world || int64_t(o.grad_accum) * cut > std::numeric_limits<int>::max()) break;
      // Uneven --rank-batches cannot be cut evenly: only the strategy may change.
      if (!o.rank_batches.empty() && cut > 1) break;
      const int rank_batch = cut == 1 ? largest_rank_batch : (o.batch / cut + world - 1) / world;
      EstimateInput in = estimate_input(o, model, world, kind, rank_batch);
      in.grad_accum = o.grad_accum * cut;
      if (!fits(in, budget)) continue;
      if (cut == 1) return strategy;
      return detail::concat(strategy, strategy.empty() ? "" : " ", "--batch ", o.batch / cut, " --grad-accum ",
                            o.grad_accum * cut, " (the same global batch)");
    }
  }
  return "";
}

// When nothing fits on this world: the fewest ranks, each with this rank's memory, on which zero3 with one
// sequence per rank would (--batch and --grad-accum keep the global batch where the world divides it).
std::string more_ranks(const TrainOptions& o, const Model& model, int world, int64_t budget) {
  const int64_t global = int64_t(o.batch) * o.grad_accum;
  for (int ranks = world * 2; ranks <= (1 << 16); ranks *= 2) {
    EstimateInput in = estimate_input(o, model, ranks, StrategyKind::zero3, 1);
    const bool keeps_global = global % ranks == 0 && global / ranks <= std::numeric_limits<int>::max();
    if (keeps_global) in.grad_accum = int(global / ranks);
    if (!fits(in, budget)) continue;
    const std::string batch = keeps_global ? detail::concat(" (--batch ", ranks, " --grad-accum ", global / ranks, ")") : "";
    return detail::concat(switch_to(o, StrategyKind::zero3), " on ", ranks, " ranks with this much memory each", batch);
  }
  return "";
}

}  // namespace

EstimateInput estimate_input(const TrainOptions& o, const Model& model, int world, StrategyKind kind,
                             int rank_batch) {
  EstimateInput in;
  in.model = &model;
  in.kind = kind;
  in.world = world;
  if (kind == StrategyKind::hybrid) {
    in.shard_group = o.strategy.shard_group;
    in.shard_group_sizes = o.strategy.shard_group_sizes;
  }
  in.max_inflight = o.strategy.max_inflight;
  in.reshard_after_forward = o.strategy.reshard_after_forward;
  in.dtypes = o.placement.param_dtype == DType::bf16 ? DtypePolicy::mixed_bf16() : DtypePolicy::fp32();
  in.rank_batch = rank_batch;
  in.seq = o.seq;
  in.grad_accum = o.grad_accum;
  in.offload_optimizer = o.placement.offload_optimizer;
  in.device = o.placement.device;
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

int largest_rank_batch_fitting(const TrainOptions& o, const Model& model, int world, const MemoryBudget& budget) {
  if (budget.bytes < 0) return -1;
  return largest_rank_batch(estimate_input(o, model, world, o.strategy.kind, 1), budget.bytes);
}

void check_host_memory_fits(const TrainOptions& o, const Model& model, int world, const MemoryBudget& host_budget) {
  if (host_budget.bytes < 0 || o.placement.device == Device::cpu || !o.placement.offload_optimizer) return;
  const int64_t host = estimate_memory(estimate_input(o, model, world, o.strategy.kind, 1)).host_apart();
  if (host <= host_budget.bytes) return;
  // The host bytes shrink only with the shard group: hybrid's shards more as zero3, any strategy's with
  // more ranks.
  std::string fix;
  if (o.strategy.kind == StrategyKind::hybrid &&
      estimate_memory(estimate_input(o, model, world, StrategyKind::zero3, 1)).host_apart() <= host_budget.bytes)
    fix = switch_to(o, StrategyKind::zero3);
  for (int ranks = world * 2; fix.empty() && ranks <= (1 << 16); ranks *= 2)
    if (estimate_memory(estimate_input(o, model, ranks, StrategyKind::zero3, 1)).host_apart() <= host_budget.bytes)
      fix = detail::concat(switch_to(o, StrategyKind::zero3), " on ", ranks, " ranks with this much host memory each");
  fail("--offload optimizer does not fit in host memory: this rank needs about ", format_bytes(double(host)),
       " of page-locked host memory, it can use ", format_bytes(double(host_budget.bytes)), " (",
       host_budget.source, "); ", fix.empty() ? "" : "nearest that fits: " + fix + ", or ",
       "--offload none (--mem-check off skips this check)");
}

void check_memory_fits(const TrainOptions& o, const Model& model, int world, int rank_batch,
                       int largest_rank_batch, const MemoryBudget& budget) {
  if (budget.bytes < 0) return;
  const MemoryEstimate e = estimate_memory(estimate_input(o, model, world, o.strategy.kind, rank_batch));
  if (e.total() <= budget.bytes) return;
  const std::string fix = nearest_fit(o, model, world, largest_rank_batch, budget.bytes);
  const std::string bigger = fix.empty() ? more_ranks(o, model, world, budget.bytes) : "";
  fail("does not fit in memory: this rank needs about ", format_bytes(double(e.total())), " (model states ",
       format_bytes(double(e.model_states.total() - e.host_apart())), ", activations ",
       format_bytes(double(e.activations)),
       "), it can use ", format_bytes(double(budget.bytes)), " (", budget.source, "); ",
       !fix.empty()    ? "nearest that fits: " + fix
       : bigger.empty() ? detail::concat("no strategy or batch split fits on ", world, " rank(s) or on more of them")
                        : detail::concat("nothing fits on ", world, " rank(s); nearest that fits: ", bigger),
       " (--mem-check off skips this check)");
}

}  // namespace zshard
