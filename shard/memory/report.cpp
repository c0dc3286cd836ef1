#include <zshard/memory_report.h>

#include <algorithm>
#include <iomanip>
#include <ostream>

#include <nlohmann/json.hpp>

#include <zshard/error.h>
#include <zshard/plan.h>

#include "comm/rank_list.h"

namespace zshard {

namespace {

std::string mib(double bytes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(bytes < 10 * 1048576.0 ? 3 : 1) << bytes / 1048576.0;
  return os.str();
}

}  // namespace

int64_t MemoryReport::measured_model_states(int group_size) const {
  int64_t m = 0;
  for (const auto& r : ranks)
    if (group_size == 0 || r.shard_group == group_size) m = std::max(m, r.stats.model_states_live());
  return m;
}

int64_t MemoryReport::measured_checkpoint_snapshot() const {
  int64_t m = 0;
  for (const auto& r : ranks) m = std::max(m, r.stats.peak[int(Category::host)] - r.stats.live[int(Category::host)]);
  return m;
}

void MemoryReport::print(std::ostream& out) const {
  out << "memory report: " << strategy << ", world " << world << ", shard group " << ShardGroups(shard_group_sizes).describe() << ", "
      << (secondary_group_sizes.empty() ? "" : "secondary groups " + ShardGroups(secondary_group_sizes).describe() + ", ")
      << params << " parameters" << (frozen_params ? detail::concat(" (", frozen_params, " frozen)") : "") << ", " << device << " memory"
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
  const auto predicted_for = [&](int g) -> const ModelStateBytes& {
    return std::find_if(ranks.begin(), ranks.end(), [&](const RankMemory& r) { return r.shard_group == g; })->predicted;
  };
  const auto of_groups = [&](int g) { return sizes.size() > 1 ? detail::concat(" (shard groups of ", g, ")") : ""; };
  for (int g : sizes) {
    const ModelStateBytes& p = predicted_for(g);
    const double measured = double(measured_model_states(g));
    out << "model states per rank" << of_groups(g)
        << ": measured " << mib(measured) << " MiB, predicted " << mib(double(p.total())) << " MiB (params "
        << mib(double(p.params)) << (p.frozen ? " + frozen " + mib(double(p.frozen)) : "") << " + grads " << mib(double(p.grads)) << " + optimizer " << mib(double(p.optimizer))
        << (p.host ? " + host " + mib(double(p.host)) : "") << "), ratio " << std::fixed << std::setprecision(3)
        << measured / std::max(1.0, double(p.total())) << "\n";
  }
  // What stays on the device beside what moved to host memory, per group size; ZeRO-Offload's split
  // (predicted for rank 0's group) beside it.
  for (int g : predicted.host > 0 ? sizes : std::vector<int>{}) {
    const ModelStateBytes& p = predicted_for(g);
    const bool rank0s = g == shard_group;
    int64_t host = 0;
    for (const auto& r : ranks)
      if (r.shard_group == g) host = std::max(host, r.stats.live[int(Category::host)]);
    out << "offloaded optimizer (host)" << of_groups(g) << ": measured " << mib(double(host)) << " MiB, predicted "
        << mib(double(p.host)) << " MiB"
        << (rank0s ? " (ZeRO-Offload, gradients on the host too: " + mib(double(predicted_zero_offload.host)) + " MiB)"
                   : "")
        << "; model states left on the device: measured " << mib(double(measured_model_states(g)) - double(host))
        << " MiB, predicted " << mib(double(p.on_device())) << " MiB"
        << (rank0s ? " (ZeRO-Offload: " + mib(double(predicted_zero_offload.on_device())) + " MiB)" : "") << "\n";
  }
  if (predicted_checkpoint_snapshot > 0)
    out << "checkpoint snapshot (host, asynchronous saves): measured " << mib(double(measured_checkpoint_snapshot()))
        << " MiB (the peak), predicted up to " << mib(double(predicted_checkpoint_snapshot))
        << " MiB per rank of the first shard group\n";
  if (predicted_inflight > 0)
    out << "gathered units in flight (comm): up to ~" << mib(double(predicted_inflight)) << " MiB predicted\n";
  // Per prediction: the ranks of unequal shard or secondary groups reduce and gather over different
  // numbers of peers, each measured against its own.
  std::vector<int64_t> theories;
  for (const RankMemory& r : ranks)
    if (std::find(theories.begin(), theories.end(), r.predicted_comm_bytes) == theories.end())
      theories.push_back(r.predicted_comm_bytes);
  for (int64_t theory : theories) {
    double measured_comm = 0;
    std::vector<int> which;
    for (size_t r = 0; r < ranks.size(); ++r)
      if (ranks[r].predicted_comm_bytes == theory) {
        measured_comm = std::max(measured_comm, ranks[r].comm_bytes_per_step);
        which.push_back(int(r));
      }
    out << "communication per step per rank" << (theories.size() > 1 ? " (" + comm::rank_list(which) + ")" : "")
        << ": measured " << mib(measured_comm) << " MiB, theory " << mib(double(theory)) << " MiB\n";
  }
}

std::string MemoryReport::to_json(int indent) const {
  nlohmann::json j;
  j["strategy"] = strategy;
  j["device"] = device;
  j["param_dtype"] = param_dtype;
  j["reduce_dtype"] = reduce_dtype;
  j["world"] = world;
  j["shard_group"] = shard_group;
  j["shard_group_sizes"] = shard_group_sizes;
  if (!secondary_group_sizes.empty()) j["secondary_group_sizes"] = secondary_group_sizes;
  j["params"] = params;
  j["frozen_params"] = frozen_params;
  j["predicted"] = {{"params", predicted.params},
                    {"frozen", predicted.frozen},
                    {"grads", predicted.grads},
                    {"optimizer", predicted.optimizer},
                    {"host", predicted.host},
                    {"model_states", predicted.total()},
                    {"zero_offload", {{"host", predicted_zero_offload.host},
                                      {"on_device", predicted_zero_offload.on_device()}}},
                    {"gathered_in_flight", predicted_inflight},
                    {"checkpoint_snapshot", predicted_checkpoint_snapshot},
                    {"comm_bytes_per_step", predicted_comm_bytes}};
  j["measured_model_states_max"] = measured_model_states();
  j["measured_checkpoint_snapshot"] = measured_checkpoint_snapshot();
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
    rank["predicted_comm_bytes_per_step"] = r.predicted_comm_bytes;
    j["ranks"].push_back(rank);
  }
  return j.dump(indent);
}

}  // namespace zshard
