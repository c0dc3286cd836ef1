#include "runtime/planning/memory_report.h"

#include <algorithm>
#include <iomanip>
#include <ostream>

#include <nlohmann/json.hpp>

namespace zshard {

namespace {

// Per-rank record shipped through one all-gather of doubles (byte counts stay exact below 2^53).
constexpr int kRecord = 2 * kNumCategories + 5;

std::vector<double> encode(const RankMemory& r) {
  std::vector<double> v;
  for (int c = 0; c < kNumCategories; ++c) v.push_back(double(r.stats.live[c]));
  for (int c = 0; c < kNumCategories; ++c) v.push_back(double(r.stats.peak[c]));
  v.push_back(double(r.stats.live_total));
  v.push_back(double(r.stats.peak_total));
  v.push_back(double(r.stats.model_states_peak));
  v.push_back(r.comm_bytes_per_step);
  v.push_back(r.comm_exposed_ms_per_step);
  return v;
}

RankMemory decode(const double* v) {
  RankMemory r;
  for (int c = 0; c < kNumCategories; ++c) r.stats.live[c] = int64_t(v[c]);
  for (int c = 0; c < kNumCategories; ++c) r.stats.peak[c] = int64_t(v[kNumCategories + c]);
  r.stats.live_total = int64_t(v[2 * kNumCategories]);
  r.stats.peak_total = int64_t(v[2 * kNumCategories + 1]);
  r.stats.model_states_peak = int64_t(v[2 * kNumCategories + 2]);
  r.comm_bytes_per_step = v[2 * kNumCategories + 3];
  r.comm_exposed_ms_per_step = v[2 * kNumCategories + 4];
  return r;
}

// This rank's memory on `device`. On a GPU the host column is the host allocator's (the offloaded
// optimizer's state and staging), while the totals stay the device's, what its memory holds; that host
// memory is allocated once, at set-up, so its peak adds to the device's model-state peak.
MemStats rank_memory(Device device) {
  MemStats stats = Allocator::of(device).stats();
  if (device == Device::cpu) return stats;
  const MemStats host = Allocator::of(Device::cpu).stats();
  const int c = int(Category::host);
  stats.live[c] = host.live[c];
  stats.peak[c] = host.peak[c];
  stats.model_states_peak += host.peak[c];
  return stats;
}

std::string mib(double bytes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(bytes < 10 * 1048576.0 ? 3 : 1) << bytes / 1048576.0;
  return os.str();
}

}  // namespace

MemoryReport MemoryReport::collect(Trainer& trainer) {
  MemoryReport rep;
  ShardedParams& params = trainer.params();
  comm::Communicator& world = trainer.world();
  rep.strategy = std::string(strategy_name(params.options().kind));
  rep.world = world.size();
  const ShardGroups& groups = params.groups();
  rep.shard_group = groups.size_of_rank(0);
  rep.shard_group_sizes = groups.sizes();
  int64_t max_unit = 0;
  for (int u = 0; u < params.num_units(); ++u) {
    rep.params += params.layout(u).numel();
    max_unit = std::max(max_unit, params.layout(u).numel());
  }
  const Placement& placement = params.placement();
  rep.device = std::string(device_name(placement.device));
  rep.param_dtype = std::string(dtype_flag(placement.param_dtype));
  rep.reduce_dtype = std::string(dtype_flag(placement.reduce_dtype));
  const DtypePolicy dtypes = DtypePolicy::of(placement.param_dtype);
  if (placement.offload_optimizer)
    rep.predicted_zero_offload = predict_zero_offload(params.options().kind, rep.shard_group, rep.params, dtypes);
  rep.predicted_inflight = params_sharded(params.options().kind)
                               ? int64_t(params.options().max_inflight) * max_unit * dtypes.param_bytes
                               : 0;
  DtypePolicy traffic = dtypes;  // gradients travel in the reduce dtype
  traffic.grad_bytes = int(dtype_size(placement.reduce_dtype));

  // The model's own gather schedule where a step has recorded it, the paper's 2Ψ before.
  const int64_t gathered =
      params.gathered_numel_per_micro_step() > 0 ? params.gathered_numel_per_micro_step() : 2 * rep.params;
  RankMemory mine;
  mine.stats = rank_memory(placement.device);
  const auto& history = trainer.history();
  for (const auto& h : history) {
    mine.comm_bytes_per_step += double(h.comm_bytes) / history.size();
    mine.comm_exposed_ms_per_step += h.comm_exposed_ms / history.size();
  }
  const std::vector<double> local = encode(mine);
  std::vector<double> all(size_t(kRecord) * world.size());
  world.all_gather(local.data(), all.data(), kRecord, DType::f64)->wait();
  for (int r = 0; r < world.size(); ++r) {
    RankMemory& rank = rep.ranks.emplace_back(decode(all.data() + size_t(r) * kRecord));
    rank.shard_group = groups.size_of_rank(r);
    rank.predicted = predict_model_states(params.options().kind, rank.shard_group, rep.params, dtypes,
                                          placement.offload_optimizer, placement.device);
    rank.predicted_comm_bytes = predict_comm_bytes(params.options().kind, groups, rank.shard_group, rep.params,
                                                   gathered, trainer.options().grad_accum, traffic);
  }
  rep.predicted = rep.ranks[0].predicted;
  rep.predicted_comm_bytes = rep.ranks[0].predicted_comm_bytes;
  return rep;
}

int64_t MemoryReport::measured_model_states(int group_size) const {
  int64_t m = 0;
  for (const auto& r : ranks)
    if (group_size == 0 || r.shard_group == group_size) m = std::max(m, r.stats.model_states_live());
  return m;
}

void MemoryReport::print(std::ostream& out) const {
  out << "memory report: " << strategy << ", world " << world << ", shard group " << ShardGroups(shard_group_sizes).describe() << ", "
      << params << " parameters, " << device << " memory"
      << (device != "cpu" && predicted.host > 0 ? " (host: page-locked host memory)" : "") << ", " << param_dtype
      << " params, " << reduce_dtype << " reduce (MiB; live / peak per category)\n";
  out << std::left << std::setw(6) << "rank";
  for (Category c : kAllCategories) out << std::setw(20) << category_name(c);
  out << std::setw(12) << "peak total" << "comm/step\n";
  for (size_t r = 0; r < ranks.size(); ++r) {
    const MemStats& s = ranks[r].stats;
    out << std::setw(6) << r;
    for (Category c : kAllCategories)
      out << std::setw(20) << (mib(double(s.live[int(c)])) + " / " + mib(double(s.peak[int(c)])));
    out << std::setw(12) << mib(double(s.peak_total)) << mib(ranks[r].comm_bytes_per_step) << "\n";
  }
  // One line per group size: unequal groups hold shards of different sizes, each with its prediction.
  std::vector<int> sizes;
  for (const RankMemory& r : ranks)
    if (std::find(sizes.begin(), sizes.end(), r.shard_group) == sizes.end()) sizes.push_back(r.shard_group);
  for (int g : sizes) {
    const ModelStateBytes& p =
        std::find_if(ranks.begin(), ranks.end(), [&](const RankMemory& r) { return r.shard_group == g; })->predicted;
    const double measured = double(measured_model_states(g));
    out << "model states per rank" << (sizes.size() > 1 ? detail::concat(" (shard groups of ", g, ")") : "")
        << ": measured " << mib(measured) << " MiB, predicted " << mib(double(p.total())) << " MiB (params "
        << mib(double(p.params)) << " + grads " << mib(double(p.grads)) << " + optimizer " << mib(double(p.optimizer))
        << (p.host ? " + host " + mib(double(p.host)) : "") << "), ratio " << std::fixed << std::setprecision(3)
        << measured / std::max(1.0, double(p.total())) << "\n";
  }
  const double measured = double(measured_model_states(shard_group));
  if (predicted.host > 0) {
    // ZeRO-Offload's split: what stays on the device beside what moved to host memory.
    int64_t host = 0;
    for (const auto& r : ranks)
      if (r.shard_group == shard_group) host = std::max(host, r.stats.live[int(Category::host)]);
    out << "offloaded optimizer (host): measured " << mib(double(host)) << " MiB, predicted " << mib(double(predicted.host))
        << " MiB (ZeRO-Offload, gradients on the host too: " << mib(double(predicted_zero_offload.host))
        << " MiB); model states left on the device: measured " << mib(measured - double(host)) << " MiB, predicted "
        << mib(double(predicted.on_device())) << " MiB (ZeRO-Offload: "
        << mib(double(predicted_zero_offload.on_device())) << " MiB)\n";
  }
  if (predicted_inflight > 0)
    out << "gathered units in flight (comm): up to ~" << mib(double(predicted_inflight)) << " MiB predicted\n";
  out << "communication per step per rank: measured " << mib(ranks.empty() ? 0 : ranks[0].comm_bytes_per_step)
      << " MiB, theory " << mib(double(predicted_comm_bytes)) << " MiB\n";
}

nlohmann::json MemoryReport::to_json() const {
  nlohmann::json j;
  j["strategy"] = strategy;
  j["device"] = device;
  j["param_dtype"] = param_dtype;
  j["reduce_dtype"] = reduce_dtype;
  j["world"] = world;
  j["shard_group"] = shard_group;
  j["shard_group_sizes"] = shard_group_sizes;
  j["params"] = params;
  j["predicted"] = {{"params", predicted.params},
                    {"grads", predicted.grads},
                    {"optimizer", predicted.optimizer},
                    {"host", predicted.host},
                    {"model_states", predicted.total()},
                    {"zero_offload", {{"host", predicted_zero_offload.host},
                                      {"on_device", predicted_zero_offload.on_device()}}},
                    {"gathered_in_flight", predicted_inflight},
                    {"comm_bytes_per_step", predicted_comm_bytes}};
  j["measured_model_states_max"] = measured_model_states();
  for (const auto& r : ranks) {
    nlohmann::json rank;
    for (Category c : kAllCategories) {
      rank["live"][std::string(category_name(c))] = r.stats.live[int(c)];
      rank["peak"][std::string(category_name(c))] = r.stats.peak[int(c)];
    }
    rank["live_total"] = r.stats.live_total;
    rank["peak_total"] = r.stats.peak_total;
    rank["model_states_live"] = r.stats.model_states_live();
    rank["model_states_peak"] = r.stats.model_states_peak;
    rank["comm_bytes_per_step"] = r.comm_bytes_per_step;
    rank["comm_exposed_ms_per_step"] = r.comm_exposed_ms_per_step;
    rank["shard_group"] = r.shard_group;
    rank["predicted_model_states"] = r.predicted.total();
    j["ranks"].push_back(rank);
  }
  return j;
}

}  // namespace zshard
