// zshard-bench: the same model and global batch under each strategy, after warm-up steps. Prints a
// table and writes JSON (--json): step time (median, p10, p90), tokens/s, achieved TFLOP/s and MFU
// (with --peak-tflops), peak bytes per category (max over ranks), communication bytes per step measured
// and in theory, and communication time exposed vs total. Run it under mpirun (CPU) or on GPUs.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "comm/agreed_failure.h"
#include "comm/polling_work.h"
#include "kernels/allocator.h"
#include "kernels/device_memory.h"
#include "kernels/engine_ops.h"
#include "kernels/io/atomic_file.h"
#include "runtime/cli/path_checks.h"
#include "models/config_json.h"
#include "kernels/io/fixed_text.h"
#include "runtime/tools/tool_runner.h"
#include "runtime/tools/tools.h"
#include "runtime/cli/flags.h"
#include "runtime/cli/plan_flags.h"
#include "runtime/cli/train_options.h"
#include "runtime/train/trainer.h"
#include "shard/engine_internals.h"
#include "shard/frozen_params.h"
#include "shard/plan_internals.h"

namespace zshard {
using nlohmann::json;

namespace {

struct BenchOptions {
  std::vector<std::string> strategies{"ddp", "zero1", "zero2", "zero3", "hybrid"};
  int warmup_steps = 2;
  std::string json_path;
  double peak_tflops = 0;  // per rank; 0 = unknown (no MFU)
  // How each strategy splits the global batch: even, and/or auto (by measured speed, timed once settled).
  std::vector<std::string> splits{"even"};
};

// Warm-up steps of an auto run: enough re-splits to settle before the clock starts.
int warmup_steps(const BenchOptions& bench, const TrainOptions& options) {
  return options.data.rank_batches_auto ? bench.warmup_steps + 2 * options.data.rebalance_interval() : bench.warmup_steps;
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * double(v.size() - 1);
  const size_t i = size_t(pos);
  return i + 1 < v.size() ? v[i] + (pos - double(i)) * (v[i + 1] - v[i]) : v.back();
}

// Hybrid needs two or more groups, one of them sharding: the groups asked for, or the default.
bool hybrid_runs(const ShardGroups& groups) {
  return groups.count() > 1 && *std::max_element(groups.sizes().begin(), groups.sizes().end()) > 1;
}

// The collectives every rank replays, alike: ranks of unequal shard groups issue different ones (a rank of
// the small group reduces its shard with several peers in turn), so each collective's most calls and
// largest mean size over the ranks. Collective over `world`.
comm::CommStats agreed_stats(comm::Communicator& world, const comm::CommStats& mine) {
  const size_t n = size_t(world.size()), me = size_t(world.rank());
  std::vector<double> all(2 * comm::kNumCollectives * n, 0.0);
  for (int c = 0; c < comm::kNumCollectives; ++c) {
    all[(2 * size_t(c)) * n + me] = double(mine.calls[c]);
    all[(2 * size_t(c) + 1) * n + me] = mine.calls[c] ? double(mine.bytes[c]) / double(mine.calls[c]) : 0;
  }
  comm::all_reduce_sum(world, all.data(), all.size());
  comm::CommStats agreed;
  for (int c = 0; c < comm::kNumCollectives; ++c) {
    const auto row = [&](size_t r) { return all.begin() + std::ptrdiff_t(r * n); };
    agreed.calls[c] = int64_t(*std::max_element(row(2 * size_t(c)), row(2 * size_t(c) + 1)));
    agreed.bytes[c] = int64_t(*std::max_element(row(2 * size_t(c) + 1), row(2 * size_t(c) + 2)) * double(agreed.calls[c]));
  }
  return agreed;
}

// Time of the step's collectives with no compute beside them: each collective the step issued, the same
// number of calls at their mean size, on the communicator and the buffers' device the step used (nccl,
// or the mpi world with host or staged device buffers). With the exposed time this gives how much communication the step hid behind
// compute. The device is synchronised before the clock stops: nccl's waits only order the streams.
// With `latency_only`, the same calls of one element per rank: what the calls cost whatever they carry.
double replay_comm_ms(comm::Communicator& comm, Device device, const comm::CommStats& per_run, int steps,
                      bool latency_only = false) {
  const int n = comm.size();
  if (n == 1) return 0;
  double total_ms = 0;
  for (int i = 0; i < comm::kNumCollectives; ++i) {
    const auto c = comm::Collective(i);
    const int64_t calls = per_run.calls[int(c)] / steps;
    if (calls == 0) continue;
    const double bus = double(per_run.bytes[int(c)]) / double(per_run.calls[int(c)]);
    const double factor = comm::bus_bytes(c, n, int64_t(n) * 1000000) / double(int64_t(n) * 1000000);
    const size_t elems = latency_only ? size_t(n) : std::max<size_t>(size_t(n), size_t(bus / factor / 4) / n * n);
    const size_t bytes = elems * sizeof(float);
    Buffer a(bytes, device, Category::comm), b(bytes, device, Category::comm);
    memset_device(device, a.data(), 0, bytes);  // defined values: no NaN or denormal slow paths
    comm.barrier();
    const auto t0 = comm::Clock::now();
    for (int64_t k = 0; k < calls; ++k) {
      switch (c) {
        case comm::Collective::all_gather: comm.all_gather(a.data(), b.data(), elems / n, DType::f32)->wait(); break;
        case comm::Collective::reduce_scatter:
          comm.reduce_scatter(a.data(), b.data(), elems / n, DType::f32, comm::ReduceOp::sum)->wait();
          break;
        case comm::Collective::all_reduce: comm.all_reduce(a.data(), elems, DType::f32, comm::ReduceOp::sum)->wait(); break;
        case comm::Collective::broadcast: comm.broadcast(a.data(), elems, DType::f32, 0)->wait(); break;
        case comm::Collective::all_to_all: comm.all_to_all(a.data(), b.data(), elems / n, DType::f32)->wait(); break;
      }
    }
    ops::synchronize(device);
    total_ms += std::chrono::duration<double, std::milli>(comm::Clock::now() - t0).count();
  }
  return total_ms;
}

json run_strategy(const std::string& name, const std::string& split, TrainOptions options, const BenchOptions& bench,
                  comm::Communicator& world) {
  options.plan.strategy.kind = parse_strategy(name);
  DataOptions& data = options.data;
  data.rank_batches_auto = split == "auto";
  if (!data.rank_batches_auto) {  // limits of the auto split only
    data.max_rank_batch.reset();
    data.rebalance_every.reset();
  }
  const int timed = options.optimizer.steps, warmup = warmup_steps(bench, options);
  options.optimizer.steps = warmup + timed;
  Trainer trainer(options, world);
  Engine& engine = trainer.engine();
  const Device device = trainer.plan().placement.device;
  Allocator::of(device).reset_peaks();  // peaks of the steps, not of initialisation
  for (int s = 0; s < warmup; ++s) trainer.step();
  engine.reset_comm_stats();
  std::vector<double> ms;
  double exposed_ms = 0, comm_bytes = 0;
  for (int s = 0; s < timed; ++s) {
    const StepResult r = trainer.step();
    ms.push_back(r.ms);
    exposed_ms += r.comm_exposed_ms / timed;
    comm_bytes += double(r.comm_bytes) / timed;
  }
  const comm::CommStats stats = engine.comm_stats();
  const MemoryReport report = engine.memory_report();
  const comm::CommStats replayed = agreed_stats(world, stats);
  const double total_comm_ms = replay_comm_ms(EngineInternals::collective_world(engine), device, replayed, timed);
  const double latency_ms = replay_comm_ms(EngineInternals::collective_world(engine), device, replayed, timed, true);
  // The ideal step: the global batch computed at the ranks' summed throughput, no rank waiting for another.
  const std::vector<double> seq_per_s = trainer.gathered_seq_per_s();
  double total_seq_per_s = 0;
  for (double v : seq_per_s) total_seq_per_s += v;

  const double median = percentile(ms, 0.5);
  const double tokens = double(data.batch) * data.seq * data.grad_accum;
  const double tflops = trainer.model().flops_per_token(data.seq) * tokens / (median / 1e3) / 1e12;
  json peak_bytes;
  int64_t peak_total = 0;
  for (Category c : kAllCategories) {
    int64_t m = 0;
    for (const auto& r : report.ranks) m = std::max(m, r.stats.peak[int(c)]);
    peak_bytes[std::string(category_name(c))] = m;
  }
  for (const auto& r : report.ranks) peak_total = std::max(peak_total, r.stats.peak_total);
  // The largest micro-batch any rank had in any step (warm-up included), which sized its peak memory.
  int rank_batch_max = 0;
  for (const StepResult& h : trainer.history())
    rank_batch_max = std::max(rank_batch_max, *std::max_element(h.rank_batches.begin(), h.rank_batches.end()));
  json j = {{"strategy", name},
            {"rank_batches", split},
            {"rank_batch_max", rank_batch_max},
            // The split the last timed step ran with (the trainer may have re-split after it, for a next step).
            {"split", trainer.history().back().rank_batches},
            {"measured_seq_per_s", seq_per_s},
            {"ideal_step_ms", double(data.batch) * data.grad_accum / total_seq_per_s * 1e3},
            {"world", world.size()},
            {"shard_group", report.shard_group},
            {"shard_group_sizes", report.shard_group_sizes},
            {"backend", EngineInternals::collective_world(engine).backend()},
            {"step_ms", {{"median", median}, {"p10", percentile(ms, 0.1)}, {"p90", percentile(ms, 0.9)}, {"all", ms}}},
            {"tokens_per_s", tokens / (median / 1e3)},
            {"tflops", tflops},
            {"mfu", bench.peak_tflops > 0 ? json(tflops / (bench.peak_tflops * world.size())) : json(nullptr)},
            {"peak_bytes", peak_bytes},
            {"peak_total_bytes", peak_total},
            {"model_states_bytes", {{"measured", report.measured_model_states(report.shard_group)}, {"theory", report.predicted.total()}}},
            {"comm_bytes_per_step", {{"measured", comm_bytes}, {"theory", report.predicted_comm_bytes}}},
            {"comm_ms_per_step", {{"exposed", exposed_ms}, {"total", total_comm_ms}, {"latency", latency_ms}}},
            {"memory_report", json::parse(report.to_json())}};
  return j;
}

void print_table(const json& results, std::ostream& out) {
  const double MiB = 1048576.0;
  out << std::left << std::setw(11) << "strategy" << std::right << std::setw(6) << "world" << std::setw(4) << "G"
      << std::setw(10) << "med ms" << std::setw(10) << "p10" << std::setw(10) << "p90" << std::setw(10) << "tok/s"
      << std::setw(9) << "TFLOP/s" << std::setw(7) << "MFU" << std::setw(18) << "states MiB m/th"
      << std::setw(11) << "peak MiB" << std::setw(20) << "comm MiB/step m/th" << std::setw(18)
      << "comm ms exp/tot" << "\n";
  for (const json& r : results) {
    const json& st = r["step_ms"];
    const std::string split = r["rank_batches"] == "auto" ? "/auto" : "";
    // Unequal groups by their sizes ("3,1"; files written before they were recorded: shard_group); the
    // states columns are group 0's.
    const std::vector<int> sizes = r.value("shard_group_sizes", std::vector<int>{});
    const std::string groups = sizes.empty() ? std::to_string(r["shard_group"].get<int>()) : ShardGroups(sizes).describe();
    out << std::left << std::setw(11) << r["strategy"].get<std::string>() + split << std::right << std::setw(6)
        << r["world"].get<int>() << std::setw(4) << groups << std::setw(10)
        << fixed(st["median"], 1) << std::setw(10) << fixed(st["p10"], 1) << std::setw(10) << fixed(st["p90"], 1)
        << std::setw(10) << fixed(r["tokens_per_s"], 0) << std::setw(9) << fixed(r["tflops"], 4) << std::setw(7)
        << (r["mfu"].is_null() ? std::string("-") : fixed(100 * r["mfu"].get<double>(), 1) + "%")
        << std::setw(18)
        << (fixed(r["model_states_bytes"]["measured"].get<double>() / MiB, 2) + "/" +
            fixed(r["model_states_bytes"]["theory"].get<double>() / MiB, 2))
        << std::setw(11) << fixed(r["peak_total_bytes"].get<double>() / MiB, 2) << std::setw(20)
        << (fixed(r["comm_bytes_per_step"]["measured"].get<double>() / MiB, 2) + "/" +
            fixed(r["comm_bytes_per_step"]["theory"].get<double>() / MiB, 2))
        << std::setw(18)
        << (fixed(r["comm_ms_per_step"]["exposed"], 1) + "/" + fixed(r["comm_ms_per_step"]["total"], 1)) << "\n";
  }
}

std::string hostname() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

// The --json document: the run's set-up and every strategy's results.
json report_json(const json& results, const TrainOptions& options, const ModelConfig& config, const Model& model,
                 AttentionKernel attention, const BenchOptions& bench, const comm::Communicator& world,
                 const HostLayout& hosts) {
  const DataOptions& data = options.data;
  return {{"tool", "zshard-bench"},
          {"machine", {{"host", hostname()}, {"hardware_threads", std::thread::hardware_concurrency()}}},
          {"hosts", hosts.sizes},  // each host's ranks, as the launcher placed them
          {"hosts_consecutive", hosts.consecutive},
          {"model", {{"name", options.model.name}, {"config", config}, {"params", num_params(model)},
                     {"frozen_params", count_params(model, options.model.freeze).frozen},
                     {"units", model.units().size()}}},
          {"batch", data.batch},
          {"seq", data.seq},
          {"grad_accum", data.grad_accum},
          {"rank_batch_max", (data.batch + world.size() - 1) / world.size()},
          {"max_inflight", options.plan.strategy.max_inflight},
          // The modes that change memory, as given: each strategy takes those it can (strategy_options_for).
          {"reshard_after_forward", options.plan.strategy.reshard_after_forward},
          {"quantize_gathers", gather_quantization_name(options.plan.strategy.quantize_gathers)},
          {"quantize_reductions", reduction_quantization_name(options.plan.strategy.quantize_reductions)},
          {"secondary_shard", secondary_shard_text(options.plan.strategy.secondary_shard)},
          {"freeze", options.model.freeze},
          {"offload", options.plan.placement.offload_optimizer ? "optimizer" : "none"},
          {"activation_checkpointing", recompute_flag(options.model.recompute)},
          {"attention", attention_flag(attention)},
          {"fused_epilogues", fused_epilogues_flag(options.model.fused_epilogues)},
          {"cuda_graphs", options.model.cuda_graphs},
          {"warmup_steps", bench.warmup_steps},
          {"rank_batch_splits", bench.splits},
          {"rebalance_every", data.rebalance_interval()},
          {"steps", options.optimizer.steps},
          {"world", world.size()},
          {"poll_backoff", comm::poll_policy().backoff},
          {"peak_tflops_per_rank", bench.peak_tflops},
          {"results", results}};
}

}  // namespace

int bench_tool(int argc, char** argv, const std::string& default_model) {
  TrainOptions options;
  options.model.name = default_model;
  options.optimizer.steps = 5;
  options.output.log_every = 1000000;
  BenchOptions bench;
  CLI::App app{"zshard-bench: every strategy on the same model and global batch; table and JSON"};
  add_train_flags(app, options);
  app.remove_option(app.get_option("--strategy"));  // --strategies picks them here
  // Flags of a training run that a benchmark has no use for: refused (exit 2), not silently ignored.
  for (const char* train_only : {"--save", "--save-dir", "--save-every", "--save-mode", "--keep", "--resume",
                                 "--stop-file", "--log-json", "--mem-report", "--mem-budget", "--rank-batches",
                                 "--log-every", "--eval-data", "--eval-every", "--eval-batches"})
    app.remove_option(app.get_option(train_only));
  add_list_option(app, "--rank-batches", bench.splits,
                  "how each strategy splits the global batch, comma separated: even, auto (by measured speed; "
                  "timed after 2 x --rebalance-every more warm-up steps)",
                  {"even", "auto"});
  app.get_option("--steps")->description("timed optimizer steps per strategy (after --warmup-steps)");
  app.get_option("--batch")->description("global sequences per micro-step, split across ranks (auto is "
                                         "zshard-train's)")->type_name("N");
  add_list_option(app, "--strategies", bench.strategies,
                  "strategies to run, comma separated (hybrid needs two or more shard groups, one of them of two "
                  "ranks or more: a world of 3 or more)",
                  strategy_names());
  app.add_option("--warmup-steps", bench.warmup_steps, "untimed steps before the timed ones");
  app.add_option("--json", bench.json_path, "write the results as JSON to this file");
  app.add_option("--peak-tflops", bench.peak_tflops, "peak TFLOP/s of one rank's device, for MFU (0 = unknown)");
  return run_tool("zshard-bench", argc, argv, app, [&](comm::Communicator& world) {
    apply_comm_timeout(options.plan, world);  // before the first collective
    const int rank = world.rank();
    std::vector<std::string> to_run;
    ModelConfig config;
    std::unique_ptr<Model> model;
    AttentionKernel attention = AttentionKernel::blocks;
    DataOptions& data = options.data;
    run_agreed(world, [&] {
      config = resolve_model_config(options.model);
      model = build_model(options.model.name, config);
      // What each strategy's trainer will pick (its own line, if any, says why auto keeps blocks).
      attention = configure_model(*model, options.model, options.plan.placement);
      check_run_inputs(options, *model);  // before the table's header, not at the first strategy's set-up
      if (data.auto_batch)
        throw UsageError("--batch auto is zshard-train's: zshard-bench runs every strategy on one given --batch");
      if (options.optimizer.steps < 1)
        throw UsageError("--steps must be >= 1, got " + std::to_string(options.optimizer.steps));
      if (bench.warmup_steps < 0) throw UsageError("--warmup-steps must be >= 0");
      if (!(bench.peak_tflops >= 0 && std::isfinite(bench.peak_tflops)))
        throw UsageError(detail::concat("--peak-tflops must be a finite number >= 0, got ", bench.peak_tflops));
      const auto listed = [&](const char* s) {
        return std::find(bench.strategies.begin(), bench.strategies.end(), s) != bench.strategies.end();
      };
      // The groups hybrid runs with: the plan's, on these hosts (collective).
      PlanOptions hybrid = options.plan;
      hybrid.strategy = strategy_options_for(StrategyKind::hybrid, options.plan.strategy);
      const bool hybrid_listed = listed("hybrid");
      if (app.count("--shard-group") && !hybrid_listed)
        throw UsageError("--shard-group is only for hybrid: add it to --strategies");
      const std::optional<ShardGroups> groups =
          hybrid_listed ? std::optional(resolve_plan(hybrid, world).groups) : std::nullopt;
      const bool hybrid_ok = groups && hybrid_runs(*groups);
      for (const std::string& s : bench.strategies) {
        if (s != "hybrid" || hybrid_ok) {
          to_run.push_back(s);
        } else if (app.count("--strategies") || app.count("--shard-group")) {
          const int n = world.size();
          int divisor = n - 1;  // the largest proper one makes equal groups; a prime world takes n-1 and 1
          while (divisor > 1 && n % divisor != 0) --divisor;
          const std::string example = divisor > 1 ? std::to_string(divisor) : detail::concat(n - 1, ",1");
          throw UsageError(detail::concat(
              app.count("--shard-group") ? "--shard-group " + groups->describe() + ": " : "--strategies hybrid: by default, ",
              groups->count() == 1 ? "one group of the whole world is zero3" : "groups of one rank are ddp",
              n >= 3 ? "; give groups between 1 and the world, e.g. --shard-group " + example
                     : detail::concat("; a world of ", n, " has no hybrid")));
        }
      }
      // Flags of some strategies only: refused when none of those runs, instead of doing nothing.
      const auto runs = [&](const char* s) { return std::find(to_run.begin(), to_run.end(), s) != to_run.end(); };
      for (const char* flag : {"--max-inflight", "--reshard-after-forward"})
        if (app.count(flag) && !runs("zero3") && !runs("hybrid"))
          throw UsageError(std::string(flag) + " is only for zero3 and hybrid: add one to --strategies");
      std::vector<StrategyKind> kinds;
      for (const std::string& s : to_run) kinds.push_back(parse_strategy(s));
      check_modes_taken(kinds, options.plan.strategy);
      if (bench.splits.empty()) throw UsageError("--rank-batches: name at least one of even, auto");
      const bool auto_split = std::find(bench.splits.begin(), bench.splits.end(), "auto") != bench.splits.end();
      if (!auto_split && (data.max_rank_batch || data.rebalance_every))
        throw UsageError(std::string(data.max_rank_batch ? "--max-rank-batch" : "--rebalance-every") +
                         " is only for the auto split: add auto to --rank-batches");
      if (to_run.empty()) throw UsageError("--strategies: none of them runs on " + std::to_string(world.size()) + " rank(s)");
      // Each strategy's options as its trainer will check them (with the auto split where it runs: --batch
      // against the world, --max-rank-batch), before the first strategy runs for minutes.
      for (StrategyKind kind : kinds) {
        TrainOptions own = options;
        own.plan.strategy = strategy_options_for(kind, options.plan.strategy);
        own.data.rank_batches_auto = auto_split;
        validate_options(own, world.size());
        resolve_plan(own.plan, world);  // the groups on these hosts: secondary groups that do not fit them
      }
      if (!bench.json_path.empty() && rank == 0) {
        check_output_path("--json", bench.json_path);
        check_not_input({"--json", bench.json_path}, {{"--data", data.source == "default" ? "" : data.source},
                                                      {"--init-from", options.model.init_from}});
      }
    });
    if (rank == 0)
      std::cout << "zshard-bench: " << options.model.name << " (" << num_params(*model) << " parameters), world "
                << world.size() << " (" << world.backend() << "), global batch " << data.batch << "x" << data.seq
                << (data.grad_accum > 1 ? " x" + std::to_string(data.grad_accum) : "") << ", " << bench.warmup_steps
                << " warm-up + " << options.optimizer.steps << " timed steps"
                << (std::find(bench.splits.begin(), bench.splits.end(), "auto") != bench.splits.end()
                        ? detail::concat(" (auto splits: ", 2 * options.data.rebalance_interval(), " more warm-up)")
                        : "")
                << "\n";
    json results = json::array();
    for (const std::string& s : to_run) {
      TrainOptions o = options;
      o.plan.strategy = strategy_options_for(parse_strategy(s), options.plan.strategy);
      for (const std::string& split : bench.splits) {
        results.push_back(run_strategy(s, split, o, bench, world));
        const json& r = results.back();
        if (rank == 0)
          std::cout << "  " << s << " " << split << ": median " << fixed(r["step_ms"]["median"], 1) << " ms, split "
                    << r["split"].dump() << ", ideal " << fixed(r["ideal_step_ms"], 1) << " ms\n"
                    << std::flush;
      }
    }
    if (rank == 0) print_table(results, std::cout);
    if (bench.json_path.empty()) return;
    const HostLayout hosts = host_layout(world);
    run_agreed(world, [&] {
      if (rank == 0)
        write_file_atomically(bench.json_path,
                              report_json(results, options, config, *model, attention, bench, world, hosts).dump(2) + "\n");
    });
  });
}

}  // namespace zshard
