// zshard-project: projected step time and scaling efficiency of ddp, zero3 and hybrid for N = 1 to
// --max-world, with and without overlap, beside the Amdahl curve of a serial fraction. The compute time
// comes from a single-rank zshard-bench JSON (--bench) or --compute-ms; links from a profile (--link,
// --inter-link) whose values --alpha-us / --bandwidth-gbs override, the inter link's per collective too.
// The runtime's communication modes (--quantize-gathers, --quantize-reductions, --secondary-shard host)
// apply to the strategies that take them, and are refused where the runtime would refuse them. --check
// takes zshard-bench JSON measured at several world sizes (same global batch) and prints the
// projection's error on each.
#include <algorithm>
#include <climits>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <numeric>
#include <optional>

#include <nlohmann/json.hpp>

#include "kernels/io/atomic_file.h"
#include "runtime/cli/path_checks.h"
#include "runtime/cli/json_input.h"
#include "runtime/cli/plan_flags.h"
#include "runtime/planning/scaling_projection.h"
#include "runtime/tools/tool_runner.h"
#include "runtime/cli/flags.h"
#include "shard/plan_internals.h"

using namespace zshard;
using nlohmann::json;

namespace {

constexpr int kMaxWorld = 1 << 20;
const std::vector<std::string> kProjected = {"ddp", "zero3", "hybrid"};

bool listed(const std::vector<std::string>& strategies, const std::string& name) {
  return std::find(strategies.begin(), strategies.end(), name) != strategies.end();
}

// Refuses what the runtime would: a mode that none of the strategies takes (check_modes_taken, as
// zshard-bench and zshard-mem do), and zero3's secondary groups on hosts that cannot hold them: two nodes
// of --node-size (the table's worlds past one node), and --nodes.
void check_modes(const std::vector<std::string>& strategies, const StrategyOptions& asked, const ProjectionInput& in,
                 const std::vector<int>& nodes) {
  std::vector<StrategyKind> kinds;
  for (const std::string& name : strategies) kinds.push_back(parse_strategy(name));
  check_modes_taken(kinds, asked);
  if (!in.secondary_per_node) return;
  PlanOptions zero3;
  zero3.strategy = projected_strategy(StrategyKind::zero3, in);
  plan_on_hosts(zero3, {in.node_size, in.node_size});
  if (!nodes.empty()) plan_on_hosts(zero3, nodes);
}

// The bytes of a projected step, by the collectives that move them.
json volume_json(const CommVolume& v) {
  return {{"gather", v.gather}, {"reduce", v.reduce}, {"across", v.across}, {"secondary", v.secondary}};
}

double median_ms(const json& bench, const std::string& strategy) {
  for (const json& r : bench.at("results"))
    if (r.at("strategy") == strategy) return r.at("step_ms").at("median");
  return NAN;
}

// What a measurement must share with the projection's input to be compared with it (strong scaling): the
// step's sequences, and where --bench gave them, the sequence length and the model.
struct MeasuredWork {
  int64_t sequences = 0;
  int grad_accum = 1;  // zero3 and hybrid communicate in each micro-step
  std::optional<int> seq;
  std::optional<int64_t> params;
};

// A count of a bench file as the file writes it: 1e300 would wrap in the conversion and be refused, or
// compared, as another number.
int64_t file_count(std::string_view flag, const std::string& path, const json& value, const char* what, int64_t most) {
  const bool fits = value.is_number_unsigned() ? value.get<uint64_t>() <= uint64_t(most)
                                               : value.is_number_integer() && value.get<int64_t>() <= most;
  if (!fits)
    throw UsageError(detail::concat(flag, " ", path, ": ", what, " is ", value.dump(), ", not a whole number up to ", most));
  return value.get<int64_t>();
}

// A table's number format (fixed, its precision) for one section: std::cout's own comes back after, for
// what prints later (the header's link speeds and compute time).
class CoutFormat {
 public:
  CoutFormat() : flags_(std::cout.flags()), precision_(std::cout.precision()) {}
  ~CoutFormat() {
    std::cout.flags(flags_);
    std::cout.precision(precision_);
  }
  CoutFormat(const CoutFormat&) = delete;
  CoutFormat& operator=(const CoutFormat&) = delete;

 private:
  std::ios_base::fmtflags flags_;
  std::streamsize precision_;
};

MeasuredWork measured_work(std::string_view flag, const std::string& path, const json& bench) {
  const auto count = [&](const json& value, const char* what, int64_t most) {
    return file_count(flag, path, value, what, most);
  };
  const int grad_accum = int(count(bench.value("grad_accum", json(1)), "grad_accum", INT_MAX));
  return {count(bench.at("batch"), "batch", INT_MAX) * grad_accum, grad_accum,
          int(count(bench.at("seq"), "seq", INT_MAX)), count(bench.at("model").at("params"), "model params", INT64_MAX)};
}

// Predicted strong-scaling step time beside each measurement; the serial fraction (Karp-Flatt) of the
// measured ddp speed-up at the largest world.
double check(const std::vector<std::string>& paths, const std::vector<std::string>& strategies, ProjectionInput in,
             const MeasuredWork& work, json& out) {
  const CoutFormat restored;
  in.weak = false;
  in.batch_known = true;  // the measured runs' own, which every file's matches
  double serial = 0;
  int serial_world = 1;
  // Every file read, its world found and its work compared, before any line of the table.
  std::vector<std::pair<json, int>> benches;
  for (const std::string& path : paths) {
    json bench = read_json_file("--check", path);
    const int world =
        read_fields("--check", path, [&] { return int(file_count("--check", path, bench.at("world"), "world", INT_MAX)); });
    const MeasuredWork got = read_fields("--check", path, [&] { return measured_work("--check", path, bench); });
    const auto differs = [&](const char* what, const auto& measured, const auto& projected) {
      throw UsageError(detail::concat("--check ", path, ": measured at ", what, " ", measured, ", the projection's is ",
                                      projected, " (strong scaling compares the same work)"));
    };
    if (got.sequences != work.sequences) differs("a step of sequences", got.sequences, work.sequences);
    if (got.grad_accum != work.grad_accum) differs("--grad-accum", got.grad_accum, work.grad_accum);
    if (work.seq && got.seq != work.seq) differs("--seq", *got.seq, *work.seq);
    if (work.params && got.params != work.params) differs("a model of params", *got.params, *work.params);
    benches.emplace_back(std::move(bench), world);
  }
  std::cout << "\nprojection vs measured (strong scaling, global batch " << work.sequences
            << (work.grad_accum > 1 ? detail::concat(" (", in.batch, " x ", work.grad_accum, ")") : std::string())
            << "; error = predicted / measured - 1)\n"
            << std::setw(8) << "strategy" << std::setw(6) << "N" << std::setw(14) << "measured ms" << std::setw(14)
            << "no overlap" << std::setw(9) << "error" << std::setw(14) << "overlap" << std::setw(9) << "error\n";
  for (size_t i = 0; i < paths.size(); ++i) {
    const auto& [bench, world] = benches[i];
    for (const std::string& name : kProjected) {
      const double measured = read_fields("--check", paths[i], [&] { return median_ms(bench, name); });
      if (std::isnan(measured)) continue;
      if (name == "ddp" && world > serial_world) {
        serial = karp_flatt(in.compute_ms / measured, world);
        serial_world = world;
      }
      if (!listed(strategies, name)) continue;
      const ProjectedStep p = project_step(parse_strategy(name), world, in);
      const double e0 = p.step_ms / measured - 1, e1 = p.step_overlap_ms / measured - 1;
      std::cout << std::setw(8) << name << std::setw(6) << world << std::fixed << std::setprecision(1)
                << std::setw(14) << measured << std::setw(14) << p.step_ms << std::setw(8) << 100 * e0 << "%"
                << std::setw(14) << p.step_overlap_ms << std::setw(8) << 100 * e1 << "%\n";
      out.push_back({{"strategy", name}, {"world", world}, {"measured_ms", measured}, {"predicted_ms", p.step_ms},
                     {"predicted_overlap_ms", p.step_overlap_ms}, {"error", e0}, {"error_overlap", e1}});
    }
  }
  return serial;
}

// --nodes: the strategies on one cluster of nodes of the given sizes.
json project_nodes(const ShardGroups& nodes, const std::vector<std::string>& strategies, const ProjectionInput& in) {
  const CoutFormat restored;
  std::cout << "\ncluster of nodes " << join_sizes(nodes.sizes()) << " (" << nodes.world_size()
            << " ranks; hybrid shards inside each node)\n"
            << std::setw(8) << "strategy" << std::setw(12) << "step ms" << std::setw(12) << "overlap ms"
            << std::setw(12) << "comm ms" << std::setw(14) << "efficiency\n";
  json out = {{"sizes", nodes.sizes()}, {"rows", json::array()}};
  for (const std::string& name : strategies) {
    const ProjectedStep p = project_step(parse_strategy(name), nodes, in);
    std::cout << std::setw(8) << name << std::fixed << std::setprecision(1) << std::setw(12) << p.step_ms
              << std::setw(12) << p.step_overlap_ms << std::setw(12) << p.comm_ms << std::setprecision(2)
              << std::setw(9) << p.efficiency << "/" << p.efficiency_overlap << "\n";
    out["rows"].push_back({{"strategy", name}, {"step_ms", p.step_ms}, {"step_overlap_ms", p.step_overlap_ms},
                           {"comm_ms", p.comm_ms}, {"efficiency", p.efficiency},
                           {"efficiency_overlap", p.efficiency_overlap}, {"comm_bytes", volume_json(p.volume)}});
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string bench_path, link = "nvlink", inter_link = "ib", scaling = "weak", json_path;
  std::vector<std::string> check_paths, strategies = kProjected;
  ProjectionInput in;
  StrategyOptions modes;
  double alpha_us = 0, bandwidth = 0, inter_alpha_us = 0, inter_bandwidth = 0, serial = 0;
  double inter_all_gather = 0, inter_reduce_scatter = 0;
  int max_world = 1024;
  std::vector<int> nodes;
  CLI::App app{"zshard-project: projected step time and scaling efficiency of ddp, zero3 and hybrid"};
  app.option_defaults()->always_capture_default();
  CLI::Option* bench =
      app.add_option("--bench", bench_path, "zshard-bench JSON of a single-rank run: compute time, params, units, batch");
  // --bench sets these itself: given beside it, they would be silently overwritten.
  bench->excludes(app.add_option("--compute-ms", in.compute_ms, "single-rank step time (instead of --bench)"));
  // A count as zshard-mem takes it: 124e6 as well as 124000000.
  bench->excludes(app.add_option_function<double>(
      "--params",
      [&in](double n) {
        if (!(n >= 1 && n <= 1e15)) throw CLI::ValidationError("--params", detail::concat("must be in [1, 1e15], got ", n));
        in.params = int64_t(n);
      },
      "parameter count, e.g. 1.5e9 (instead of --bench)"));
  bench->excludes(app.add_option("--units", in.units, "collectives per pass: units (instead of --bench)"));
  bench->excludes(app.add_option("--batch", in.batch, "sequences of a micro-step (instead of --bench)"));
  bench->excludes(app.add_option("--grad-accum", in.grad_accum,
                                 "micro-steps the compute time covers, each gathering and reducing under zero3 and "
                                 "hybrid (instead of --bench)"));
  app.add_option("--elem-bytes", in.elem_bytes, "bytes per communicated element (4 fp32, 2 bf16)");
  app.add_option("--link", link, "intra-node link profile: nvlink, pcie, ib");
  app.add_option("--inter-link", inter_link, "inter-node link profile")->check(CLI::IsMember(link_profile_names()));
  app.add_option("--alpha-us", alpha_us, "override the intra link's per-hop latency (us)")->default_str("--link's");
  app.add_option("--bandwidth-gbs", bandwidth, "override the intra link's bus bandwidth (GB/s)")->default_str("--link's");
  app.add_option("--inter-alpha-us", inter_alpha_us, "override the inter link's latency (us)")->default_str("--inter-link's");
  app.add_option("--inter-bandwidth-gbs", inter_bandwidth, "override the inter link's bandwidth (GB/s)")->default_str("--inter-link's");
  app.add_option("--inter-all-gather-gbs", inter_all_gather, "the inter link's bandwidth in all-gathers (GB/s)")
      ->default_str("the inter link's");
  app.add_option("--inter-reduce-scatter-gbs", inter_reduce_scatter,
                 "the inter link's bandwidth in reduce-scatters and quantized reductions' all-to-alls (GB/s)")
      ->default_str("the inter link's");
  add_choice<bool>(app, "--nic-per", in.nic_per_host, {{"rank", false}, {"host", true}},
                   "rank: each rank has its own inter link; host: a host's ranks share one, so hybrid's all-reduce "
                   "across groups, which all of them run at once, gets a share each");
  add_list_option(app, "--strategies", strategies, "strategies to project, of ddp, zero3 and hybrid", kProjected);
  // zshard-train's flags, each for the strategies that take it; the secondary groups are the nodes (host).
  add_comm_mode_flags(app, modes);
  app.add_option("--node-size", in.node_size,
                 "ranks per node; hybrid's shard group is the largest divisor of N up to it leaving two replicas");
  add_list_option(app, "--nodes", nodes,
                  "node sizes of one cluster, comma separated (e.g. 4,2): also project it, hybrid sharding inside "
                  "each node",
                  Repeats::allowed);
  app.add_option("--scaling", scaling, "weak (fixed batch per rank) or strong (fixed global batch)");
  app.add_option("--max-world", max_world, "largest N (powers of two from 1)");
  app.add_option("--serial-fraction", serial, "Amdahl serial fraction (default: Karp-Flatt from --check, else 0)")
      ->default_str("");
  add_list_option(app, "--check", check_paths, "zshard-bench JSON at several world sizes to check against");
  app.add_option("--json", json_path, "write the projection as JSON to this file");
  return run_local_tool("zshard-project", argc, argv, app, [&] {
    if (!json_path.empty()) {
      check_output_path("--json", json_path);
      std::vector<FlagPath> inputs = {{"--bench", bench_path}};
      for (const std::string& p : check_paths) inputs.push_back({"--check", p});
      check_not_input({"--json", json_path}, inputs);
    }
    json bench_doc;
    if (!bench_path.empty()) {
      bench_doc = read_json_file("--bench", bench_path);
      const json& b = bench_doc;
      // What the file lacks is the file's fault, not the flags': said before the flags are checked.
      const auto bad = [&](const auto&... what) { throw UsageError(detail::concat("--bench ", bench_path, ": ", what...)); };
      const auto count = [&](const json& value, const char* what, int64_t most) {
        return file_count("--bench", bench_path, value, what, most);
      };
      read_fields("--bench", bench_path, [&] {
        // A zshard-bench result first: another tool's JSON is named as such, whatever its fields.
        in.compute_ms = median_ms(b, "ddp");
        const json& model = b.at("model");
        if (b.at("world") != 1)
          throw UsageError("--bench " + bench_path + ": needs a single-rank run, it has world " + b.at("world").dump());
        in.params = count(model.at("params"), "model params", INT64_MAX);
        in.frozen_params = count(model.value("frozen_params", json(0)), "model frozen_params", INT64_MAX);  // older files: none
        in.units = int(count(model.at("units"), "model units", INT_MAX));
        in.batch = int(count(b.at("batch"), "batch", INT_MAX));
        in.grad_accum = int(count(b.value("grad_accum", json(1)), "grad_accum", INT_MAX));  // older files: one micro-step
      });
      if (!(in.compute_ms > 0 && std::isfinite(in.compute_ms)))
        bad("no ddp result with a positive step time (run zshard-bench with ddp among --strategies)");
      if (in.params <= 0) bad("model params is ", in.params, ", not > 0");
      if (in.units < 1) bad("model units is ", in.units, ", not >= 1");
      if (in.batch < 1) bad("batch is ", in.batch, ", not >= 1");
      if (in.grad_accum < 1) bad("grad_accum is ", in.grad_accum, ", not >= 1");
    }
    if (!(in.compute_ms > 0 && std::isfinite(in.compute_ms)) || in.params <= 0)
      throw UsageError("give --bench FILE, or --compute-ms and --params (both finite and > 0)");
    if (scaling != "weak" && scaling != "strong") throw UsageError("--scaling must be weak or strong");
    for (const auto& [flag, value] : {std::pair{"--units", in.units}, std::pair{"--node-size", in.node_size},
                                      std::pair{"--max-world", max_world}, std::pair{"--elem-bytes", in.elem_bytes},
                                      std::pair{"--batch", in.batch}, std::pair{"--grad-accum", in.grad_accum}})
      if (value < 1) throw UsageError(detail::concat(flag, " must be >= 1, got ", value));
    // The table doubles N up to --max-world: past 2^20 ranks it would overflow, and means nothing.
    for (int n : nodes)
      if (n < 1 || n > kMaxWorld) throw UsageError(detail::concat("--nodes: sizes must be in [1, ", kMaxWorld, "], got ", n));
    if (const int64_t world = std::accumulate(nodes.begin(), nodes.end(), int64_t{0}); world > kMaxWorld)
      throw UsageError(detail::concat("--nodes: ", world, " ranks in all, more than ", kMaxWorld));
    if (!nodes.empty()) check_group_sizes(nodes, "--nodes");
    // Strong scaling splits the micro-step's sequences, where they are known (--bench, --batch): a rank
    // holds one at least.
    const bool batch_known = !bench_path.empty() || app.count("--batch");
    in.batch_known = batch_known;
    if (const int ranks = std::accumulate(nodes.begin(), nodes.end(), 0); scaling == "strong" && batch_known && ranks > in.batch)
      throw UsageError(detail::concat("--nodes ", join_sizes(nodes), ": ", ranks, " ranks, more than the ", in.batch,
                                      " sequences of a micro-step that strong scaling splits (--batch)"));
    if (max_world > kMaxWorld) throw UsageError(detail::concat("--max-world must be at most ", kMaxWorld, ", got ", max_world));
    for (const auto& [flag, value] : {std::pair{"--alpha-us", alpha_us}, std::pair{"--inter-alpha-us", inter_alpha_us}})
      if (app.count(flag) && !(std::isfinite(value) && value >= 0))
        throw UsageError(detail::concat(flag, " must be a finite number >= 0, got ", value));
    for (const auto& [flag, value] : {std::pair{"--bandwidth-gbs", bandwidth}, std::pair{"--inter-bandwidth-gbs", inter_bandwidth},
                                      std::pair{"--inter-all-gather-gbs", inter_all_gather},
                                      std::pair{"--inter-reduce-scatter-gbs", inter_reduce_scatter}})
      if (app.count(flag) && !(std::isfinite(value) && value > 0))
        throw UsageError(detail::concat(flag, " must be a finite number > 0, got ", value));
    if (app.count("--serial-fraction") && !(serial >= 0 && serial <= 1))
      throw UsageError(detail::concat("--serial-fraction must be in [0, 1], got ", serial));
    in.weak = scaling == "weak";
    in.intra = link_profile(link);
    in.inter = link_profile(inter_link);
    if (app.count("--alpha-us") || app.count("--bandwidth-gbs")) in.intra.name += " (overridden)";
    if (app.count("--inter-alpha-us") || app.count("--inter-bandwidth-gbs")) in.inter.name += " (overridden)";
    if (app.count("--alpha-us")) in.intra.alpha_us = alpha_us;
    if (app.count("--bandwidth-gbs")) in.intra.bandwidth_gbs = bandwidth;
    if (app.count("--inter-alpha-us")) in.inter.alpha_us = inter_alpha_us;
    if (app.count("--inter-bandwidth-gbs")) in.inter.bandwidth_gbs = inter_bandwidth;
    in.inter_all_gather_gbs = inter_all_gather;
    in.inter_reduce_scatter_gbs = inter_reduce_scatter;
    // The projection's links are a node's and the one between nodes: its secondary groups are the nodes.
    if (modes.secondary_shard.kind == SecondaryShard::Kind::size)
      throw UsageError(detail::concat("--secondary-shard ", modes.secondary_shard.size, ": zshard-project keeps the "
                                      "secondary shard per node (--node-size, --nodes): give host"));
    in.quantize_gathers = modes.quantize_gathers;
    in.quantize_reductions = modes.quantize_reductions;
    in.secondary_per_node = modes.secondary_shard.kind == SecondaryShard::Kind::host;
    check_modes(strategies, modes, in, nodes);

    json doc = {{"tool", "zshard-project"}, {"compute_ms", in.compute_ms}, {"batch", in.batch},
                {"grad_accum", in.grad_accum},
                {"params", in.params}, {"frozen_params", in.frozen_params}, {"units", in.units}, {"scaling", scaling},
                {"node_size", in.node_size},
                {"intra", {{"name", in.intra.name}, {"alpha_us", in.intra.alpha_us}, {"bandwidth_gbs", in.intra.bandwidth_gbs}}},
                {"inter", {{"name", in.inter.name}, {"alpha_us", in.inter.alpha_us}, {"bandwidth_gbs", in.inter.bandwidth_gbs},
                           {"all_gather_gbs", inter_all_gather > 0 ? inter_all_gather : in.inter.bandwidth_gbs},
                           {"reduce_scatter_gbs",
                            inter_reduce_scatter > 0 ? inter_reduce_scatter : in.inter.bandwidth_gbs}}},
                {"nic_per", in.nic_per_host ? "host" : "rank"},
                {"strategies", strategies},
                {"quantize_gathers", gather_quantization_name(in.quantize_gathers)},
                {"quantize_reductions", reduction_quantization_name(in.quantize_reductions)},
                {"secondary_shard", secondary_shard_text(modes.secondary_shard)},
                {"check", json::array()}};
    MeasuredWork work{int64_t(in.batch) * in.grad_accum, in.grad_accum, {}, {}};
    if (!bench_path.empty())
      work = read_fields("--bench", bench_path, [&] { return measured_work("--bench", bench_path, bench_doc); });
    const double fitted = check_paths.empty() ? 0 : check(check_paths, strategies, in, work, doc["check"]);
    if (!app.count("--serial-fraction")) serial = std::clamp(fitted, 0.0, 1.0);  // a slow-down (speed-up < 1) reads as all serial
    doc["serial_fraction"] = serial;
    std::cout << "\nprojection: " << in.params << " params, " << in.units << " units, compute " << in.compute_ms
              << " ms for " << in.batch << (in.grad_accum > 1 ? " x " + std::to_string(in.grad_accum) : "")
              << " sequences, " << scaling << " scaling; intra " << in.intra.name << " ("
              << in.intra.alpha_us << " us, " << in.intra.bandwidth_gbs << " GB/s), inter " << in.inter.name << " ("
              << in.inter.alpha_us << " us, " << in.inter.bandwidth_gbs << " GB/s), node " << in.node_size
              << "; efficiency no overlap / overlap\n";
    if (inter_all_gather > 0 || inter_reduce_scatter > 0 || in.nic_per_host)
      std::cout << "inter link per collective: all-gather " << doc["inter"]["all_gather_gbs"].get<double>()
                << " GB/s, reduce-scatter " << doc["inter"]["reduce_scatter_gbs"].get<double>() << " GB/s, a NIC per "
                << doc["nic_per"].get<std::string>() << "\n";
    if (in.quantize_gathers != GatherQuantization::none || in.quantize_reductions != ReductionQuantization::none ||
        in.secondary_per_node)
      std::cout << "modes: --quantize-gathers " << gather_quantization_name(in.quantize_gathers)
                << " --quantize-reductions " << reduction_quantization_name(in.quantize_reductions)
                << " --secondary-shard " << secondary_shard_text(modes.secondary_shard)
                << " (each for the strategies that take it)\n";
    std::cout << std::setw(6) << "N";
    for (const std::string& name : strategies) std::cout << std::setw(26) << (name + " ms   eff");
    std::cout << std::setw(14) << "Amdahl s=" << std::setprecision(3) << serial << "\n";
    const int last_world = in.weak || !batch_known ? max_world : std::min(max_world, in.batch);
    int last_row = 1;
    for (int n = 1; n <= last_world; n *= 2) {
      last_row = n;
      json row = {{"world", n}, {"amdahl_efficiency", amdahl_efficiency(serial, n)}};
      std::cout << std::setw(6) << n;
      for (const std::string& name : strategies) {
        const ProjectedStep p = project_step(parse_strategy(name), n, in);
        row[name] = {{"step_ms", p.step_ms}, {"step_overlap_ms", p.step_overlap_ms}, {"comm_ms", p.comm_ms},
                     {"efficiency", p.efficiency}, {"efficiency_overlap", p.efficiency_overlap},
                     {"comm_bytes", volume_json(p.volume)}};
        std::ostringstream cell;
        cell << std::fixed << std::setprecision(1) << p.step_ms << " " << std::setprecision(2) << p.efficiency << "/"
             << p.efficiency_overlap;
        std::cout << std::setw(26) << cell.str();
      }
      std::cout << std::setw(14) << std::setprecision(3) << amdahl_efficiency(serial, n) << "\n";
      doc["rows"].push_back(row);
    }
    if (last_world < max_world) {
      std::cout << "(strong scaling: no row past N = " << last_row << "; at N = " << 2 * last_row
                << " a rank would hold less than one of the " << in.batch << " sequences of a micro-step)\n";
      doc["rows_end_at_world"] = last_row;
    }
    if (!nodes.empty()) doc["nodes"] = project_nodes(ShardGroups(nodes), strategies, in);
    if (!json_path.empty()) write_file_atomically(json_path, doc.dump(2) + "\n");
    return 0;
  });
}
