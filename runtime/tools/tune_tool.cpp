// zshard-tune: the fastest configuration of one model on given ranks that fits a memory budget per rank.
// Every candidate of the search space (runtime/planning/tune_space.h) is sized by the memory estimator and
// those over the budget are pruned; the rest are ranked by the cost model (tune_cost.h). The first by
// nominal rates is run briefly and calibrates the model, then the top few by the calibrated model are
// timed (tune_search.h), each a zshard-bench job of its own under the launcher (tune_runs.h), within
// --time-budget. The winner is the fastest measured run whose peak fits, printed as the command line that
// trains with it.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kernels/io/atomic_file.h"
#include "models/config_json.h"
#include "runtime/cli/flags.h"
#include "runtime/cli/memory_flags.h"
#include "runtime/cli/model_options.h"
#include "runtime/cli/path_checks.h"
#include "runtime/cli/plan_flags.h"
#include "runtime/process/child_process.h"
#include "runtime/tools/tool_runner.h"
#include "runtime/tools/tools.h"
#include "runtime/tools/tune_search.h"
#include "runtime/train/data.h"
#include "shard/memory/fit_check.h"
#include "shard/plan_internals.h"

namespace zshard {
using nlohmann::json;

namespace {

struct TuneOptions {
  std::string model;
  ModelConfig overrides;
  std::vector<std::string> freeze;
  int global_batch = 0;
  int64_t global_tokens = 0;
  int seq = 64;
  int np = 1;
  std::vector<int> hosts;
  std::string mem_budget;
  Device device = Device::cpu;
  std::string param_dtype = "fp32";
  std::string data = "default";
  std::vector<std::string> strategies{"ddp", "zero1", "zero2", "zero3", "hybrid"};
  std::vector<int> grad_accums;
  std::vector<std::string> checkpointing{"none", "blocks"};
  std::vector<std::string> offload{"none", "optimizer"};
  std::vector<int> max_inflight{2, 1};
  std::vector<std::string> reshard{"true", "false"};
  std::vector<std::string> quantize_gathers{"none"};
  std::vector<std::string> quantize_reductions{"none"};
  std::vector<std::string> secondary_shard{"none"};
  std::string rank_batches = "detect";
  int top = 3;
  int repeats = 2;
  bool exhaustive = false;
  int steps = 3;
  int warmup_steps = 1;
  std::string time_budget = "900";
  std::string launcher = "mpirun -np {np}";
  std::string json_path;
  std::string work_dir;
};

// "900", "900s", "15m", "1h" in seconds.
double parse_seconds(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  const double scale = unit.empty() || unit == "s" ? 1 : unit == "m" ? 60 : unit == "h" ? 3600 : 0;
  if (used == 0 || scale == 0 || !(v > 0) || !std::isfinite(v))
    throw UsageError("--time-budget must be a positive duration such as 600, 90s, 15m or 1h, got '" + text + "'");
  return v * scale;
}

std::vector<std::string> words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// The launcher's words with {np} replaced by the world; without {np}, "-np N" is appended.
std::vector<std::string> launcher_words(const std::string& launcher, int world) {
  std::vector<std::string> out = words(launcher);
  bool placed = false;
  for (std::string& w : out)
    for (size_t at; (at = w.find("{np}")) != std::string::npos; placed = true) w.replace(at, 4, std::to_string(world));
  if (!placed) out.insert(out.end(), {"-np", std::to_string(world)});
  return out;
}

std::string shell_line(const std::vector<std::string>& argv) {
  std::string line;
  for (const std::string& a : argv) {
    const bool plain = !a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                         "0123456789-_./=,:+@%") == std::string::npos;
    line += (line.empty() ? "" : " ") + (plain ? a : "'" + a + "'");
  }
  return line;
}

std::string self_path() {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) fail("zshard-tune: cannot find its own binary (/proc/self/exe)");
  return p.string();
}

template <class T>
std::vector<T> parse_list(const std::vector<std::string>& given, const char* flag,
                          const std::vector<std::pair<std::string, T>>& names) {
  std::vector<T> out;
  for (const std::string& g : given) {
    const auto it = std::find_if(names.begin(), names.end(), [&](const auto& n) { return n.first == g; });
    if (it == names.end()) {
      std::string known;
      for (const auto& n : names) known += (known.empty() ? "" : ", ") + n.first;
      throw UsageError(detail::concat(flag, ": unknown value '", g, "' (", known, ")"));
    }
    out.push_back(it->second);
  }
  if (out.empty()) throw UsageError(detail::concat(flag, ": give at least one value"));
  return out;
}

// Each value as the runtime's own parser reads it (its UsageError names the flag and the valid values).
template <class Parse>
auto parse_each(const std::vector<std::string>& given, const char* flag, Parse parse) {
  std::vector<decltype(parse(std::string_view()))> out;
  for (const std::string& g : given) out.push_back(parse(g));
  if (out.empty()) throw UsageError(detail::concat(flag, ": give at least one value"));
  return out;
}

TuneSpace space_of(const TuneOptions& o) {
  TuneSpace s;
  s.strategies.clear();
  for (const std::string& name : o.strategies) s.strategies.push_back(parse_strategy(name));
  if (s.strategies.empty()) throw UsageError("--strategies: give at least one");
  s.grad_accums = o.grad_accums;
  s.checkpointing = parse_list<Recompute>(
      o.checkpointing, "--activation-checkpointing",
      {{"none", Recompute::none}, {"blocks", Recompute::blocks}});
  s.offload = parse_list<bool>(o.offload, "--offload", {{"none", false}, {"optimizer", true}});
  s.reshard = parse_list<bool>(o.reshard, "--reshard-after-forward", {{"true", true}, {"false", false}});
  s.quantize_gathers = parse_each(o.quantize_gathers, "--quantize-gathers", parse_gather_quantization);
  s.quantize_reductions = parse_each(o.quantize_reductions, "--quantize-reductions", parse_reduction_quantization);
  s.secondary_shard = parse_each(o.secondary_shard, "--secondary-shard", parse_secondary_shard);
  s.max_inflight = o.max_inflight;
  for (int m : s.max_inflight)
    if (m < 1) throw UsageError(detail::concat("--max-inflight entries must be >= 1, got ", m));
  const std::string& rb = o.rank_batches;
  if (rb != "detect" && rb != "even" && rb != "auto" && rb != "even,auto")
    throw UsageError("--rank-batches must be detect, even, auto or even,auto, got '" + rb + "'");
  s.auto_split = rb == "auto" ? std::vector<bool>{true} : rb == "even,auto" ? std::vector<bool>{false, true}
                                                                             : std::vector<bool>{false};
  return s;
}

// Where the runs' logs and JSON go: --work-dir, kept; else a temporary directory, removed at the end.
class WorkDir {
 public:
  explicit WorkDir(const std::string& given) : temporary_(given.empty()) {
    if (!temporary_) {
      std::error_code ec;
      std::filesystem::create_directories(given, ec);
      if (ec) throw UsageError(detail::concat("--work-dir ", given, ": cannot create (", ec.message(), ")"));
      path_ = given;
      return;
    }
    std::string name = (std::filesystem::temp_directory_path() / "zshard-tune-XXXXXX").string();
    if (!mkdtemp(name.data())) fail("cannot create a temporary directory in ", std::filesystem::temp_directory_path());
    path_ = name;
  }
  ~WorkDir() {
    std::error_code ignored;
    if (temporary_) std::filesystem::remove_all(path_, ignored);
  }
  WorkDir(const WorkDir&) = delete;
  WorkDir& operator=(const WorkDir&) = delete;
  const std::string& path() const { return path_; }
  bool temporary() const { return temporary_; }

 private:
  bool temporary_;
  std::string path_;
};

// Checks the flags that need no model, and settles the hosts and the global batch in sequences.
void check_options(TuneOptions& o, const CLI::App& app) {
  if (!o.json_path.empty()) {
    check_output_path("--json", o.json_path);
    check_not_input({"--json", o.json_path}, {{"--data", o.data == "default" ? "" : o.data}});
  }
  if (o.hosts.empty()) o.hosts = {o.np};
  for (int h : o.hosts)
    if (h < 1 || h > 4096)
      throw UsageError(detail::concat(app.count("--hosts") ? "--hosts" : "--np", " entries must be in [1, 4096], got ", h));
  if (o.seq < 1) throw UsageError("--seq must be >= 1, got " + std::to_string(o.seq));
  if (app.count("--global-tokens")) {
    if (o.global_tokens < 1 || o.global_tokens % o.seq != 0 || o.global_tokens / o.seq > (1 << 30))
      throw UsageError(detail::concat("--global-tokens ", o.global_tokens, " is not a whole number of --seq ", o.seq,
                                      " token sequences"));
    o.global_batch = int(o.global_tokens / o.seq);
  } else if (!app.count("--global-batch")) {
    throw UsageError("give the global batch: --global-batch SEQUENCES or --global-tokens TOKENS");
  }
  if (o.global_batch < 1) throw UsageError("--global-batch must be >= 1, got " + std::to_string(o.global_batch));
  if (o.steps < 1) throw UsageError("--steps must be >= 1, got " + std::to_string(o.steps));
  if (o.warmup_steps < 0) throw UsageError("--warmup-steps must be >= 0, got " + std::to_string(o.warmup_steps));
  if (o.top < 1) throw UsageError("--top must be >= 1, got " + std::to_string(o.top));
  if (o.repeats < 1) throw UsageError("--repeats must be >= 1, got " + std::to_string(o.repeats));
  if (words(o.launcher).empty()) throw UsageError("--launcher: empty");
  // Dimensions of some strategies alone: searched over nothing without them.
  const auto has = [&](const std::string& s) { return std::find(o.strategies.begin(), o.strategies.end(), s) != o.strategies.end(); };
  for (const char* flag : {"--max-inflight", "--reshard-after-forward", "--quantize-gathers"})
    if (app.count(flag) && !has("zero3") && !has("hybrid"))
      throw UsageError(detail::concat(flag, " is only for zero3 or hybrid, and --strategies has neither"));
  if (app.count("--secondary-shard") && !has("zero3"))
    throw UsageError("--secondary-shard is only for zero3, and --strategies has none");
  if (app.count("--quantize-reductions") &&
      std::all_of(o.strategies.begin(), o.strategies.end(), [](const std::string& s) { return s == "ddp"; }))
    throw UsageError("--quantize-reductions is only for zero1, zero2, zero3 or hybrid, and --strategies has none");
}

// The flags every run shares: the model, the sequence, the device and the data.
std::vector<std::string> common_flags(const TuneOptions& o) {
  std::vector<std::string> f = {"--model", o.model};
  if (!o.overrides.empty()) {
    std::string config;
    for (const auto& [key, value] : o.overrides) config += (config.empty() ? "" : ",") + key + "=" + value.text();
    f.insert(f.end(), {"--config", config});
  }
  if (!o.freeze.empty()) {
    std::string patterns;
    for (const std::string& p : o.freeze) patterns += (patterns.empty() ? "" : ",") + p;
    f.insert(f.end(), {"--freeze", patterns});
  }
  f.insert(f.end(), {"--seq", std::to_string(o.seq)});
  if (o.device != Device::cpu) f.insert(f.end(), {"--device", std::string(device_name(o.device))});
  if (o.param_dtype != "fp32") f.insert(f.end(), {"--param-dtype", o.param_dtype});
  if (o.data != "default") f.insert(f.end(), {"--data", o.data});
  return f;
}

// The command line that trains with `c`: zshard-train beside this binary, or this binary itself.
std::vector<std::string> train_command(const CandidateLauncher& how, const Candidate& c, bool own_modes) {
  const std::string self = self_path();
  std::vector<std::string> cmd = how.launcher;
  cmd.push_back(own_modes ? self : (std::filesystem::path(self).parent_path() / "zshard-train").string());
  cmd.insert(cmd.end(), how.common.begin(), how.common.end());
  for (const std::string& flag : c.train_flags()) cmd.push_back(flag);
  return cmd;
}

}  // namespace

int tune_tool(int argc, char** argv, const std::string& default_model, bool own_modes) {
  TuneOptions o;
  o.model = default_model;
  CLI::App app{"zshard-tune: the fastest configuration that fits a memory budget, found by the estimator and the "
               "cost model, proven by short runs"};
  app.option_defaults()->always_capture_default();
  add_model_flags(app, o.model, o.overrides);
  add_freeze_flag(app, o.freeze);
  CLI::Option* batch = app.add_option("--global-batch", o.global_batch, "sequences per optimizer step (all ranks)")
                           ->default_str("");
  batch->excludes(app.add_option("--global-tokens", o.global_tokens, "tokens per optimizer step: a multiple of --seq")
                      ->default_str(""));
  app.add_option("--seq", o.seq, "tokens per sequence");
  CLI::Option* np = app.add_option("--np", o.np, "ranks, all on one host");
  np->excludes(add_list_option(app, "--hosts", o.hosts, "ranks per host in rank order, e.g. 4,2 (hybrid shards inside hosts)",
                               Repeats::allowed));
  app.add_option("--mem-budget", o.mem_budget,
                 "memory each rank may use, e.g. 2GiB (give it when the ranks' hosts are not this one)")
      ->default_str("what the set-up memory check finds usable here");
  add_device_flag(app, o.device, "where the candidates compute: cpu or cuda");
  app.add_option("--param-dtype", o.param_dtype, "fp32, or bf16 (mixed precision)")->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--data", o.data, "what the timed runs train on, as zshard-train's --data");
  add_list_option(app, "--strategies", o.strategies, "strategies to search, comma separated (hybrid: every shard group)",
                  strategy_names());
  add_list_option(app, "--grad-accum", o.grad_accums, "micro-steps per step to search [default: every divisor]",
                  Repeats::refused)
      ->default_str("");
  add_list_option(app, "--activation-checkpointing", o.checkpointing, "none, blocks or both");
  add_list_option(app, "--offload", o.offload, "none, optimizer or both");
  add_list_option(app, "--max-inflight", o.max_inflight, "zero3/hybrid: gathered units alive at once, the values to search",
                  Repeats::refused);
  add_list_option(app, "--reshard-after-forward", o.reshard, "zero3/hybrid: true, false or both");
  add_list_option(app, "--quantize-gathers", o.quantize_gathers, "zero3/hybrid: none, int8 or both (ZeRO++ qwZ)");
  add_list_option(app, "--quantize-reductions", o.quantize_reductions,
                  "zero1/zero2/zero3/hybrid: any of none, int8, int4 (ZeRO++ qgZ)");
  add_list_option(app, "--secondary-shard", o.secondary_shard,
                  "zero3 with resharding: any of none, host, N (ZeRO++ hpZ); those the runtime refuses are skipped");
  app.add_option("--rank-batches", o.rank_batches,
                 "even, auto, even,auto, or detect: even, and auto too when the first run measures ranks of unequal "
                 "speed (more than 20% apart)");
  app.add_option("--top", o.top, "candidates timed after the calibrating run, fastest predicted first");
  app.add_option("--repeats", o.repeats,
                 "runs of each timed candidate, in rounds of alternating order; the fastest run counts");
  app.add_flag("--exhaustive", o.exhaustive, "time every candidate that fits (a benchmark of the cost model)");
  app.add_option("--steps", o.steps, "timed steps of each run");
  app.add_option("--warmup-steps", o.warmup_steps, "untimed steps of each run before them");
  app.add_option("--time-budget", o.time_budget, "the whole search's wall time: seconds, or 90s, 15m, 1h");
  app.add_option("--launcher", o.launcher,
                 "what starts a run, words separated by spaces; {np} becomes the ranks (else -np N is appended)");
  app.add_option("--json", o.json_path, "write every candidate, its estimate, prediction and run as JSON");
  app.add_option("--work-dir", o.work_dir, "keep each run's log and JSON here [default: a temporary directory]")
      ->default_str("");
  return run_local_tool("zshard-tune", argc, argv, app, [&]() -> int {
    // Under a launcher every candidate's own mpirun would fail, one after the other, with MPI's words only.
    // What mpirun and srun set for the processes they start; not SLURM_PROCID, which an sbatch script,
    // where the tuner belongs, has too.
    for (const char* launched : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
      if (std::getenv(launched))
        throw UsageError(detail::concat("run this as one process, not under mpirun or srun: it starts each run "
                                        "itself (--launcher; ", launched, " is set)"));
    check_options(o, app);
    const double time_budget = parse_seconds(o.time_budget);
    const int world = std::accumulate(o.hosts.begin(), o.hosts.end(), 0);
    const std::unique_ptr<Model> model = build_model(o.model, model_config(o.model, o.overrides));
    // The candidates run with zshard-train's default attention: estimated as they will run.
    choose_attention(*model, AttentionKernel::automatic, o.device, o.param_dtype == "bf16" ? DType::bf16 : DType::f32);
    if (o.seq > model->context_length())
      throw UsageError(detail::concat("--seq ", o.seq, " exceeds the model's context of ", model->context_length()));
    if (o.data != "default") {  // checked once here, not failed by every candidate in turn
      const TokenDataset data = TokenDataset::load(o.data, "--data");
      data.check_vocab(model->vocab_size());
      data.check_seq_len(o.seq);
    }
    TuneSpace space = space_of(o);
    if (o.hosts.size() < 2 && world < 4 && std::count(space.strategies.begin(), space.strategies.end(), StrategyKind::hybrid)) {
      if (app.count("--strategies")) throw UsageError(detail::concat("--strategies hybrid needs 4 ranks or more, got ", world));
      std::erase(space.strategies, StrategyKind::hybrid);  // no shard group between 1 and the world
    }
    MemoryBudget budget{-1, ""};
    if (!o.mem_budget.empty()) budget = {parse_bytes(o.mem_budget, "--mem-budget"), "--mem-budget"};
    else budget = usable_memory(o.device, *std::max_element(o.hosts.begin(), o.hosts.end()));
    if (budget.bytes < 0) throw UsageError("the memory a rank can use is unknown here: give --mem-budget SIZE");
    const TuneProblem problem{model.get(), world, o.hosts.size() > 1 ? o.hosts : std::vector<int>{}, o.global_batch,
                              o.seq, o.param_dtype == "bf16" ? DType::bf16 : DType::f32,
                              o.device, budget.bytes, o.freeze};

    CandidateLauncher how;
    how.launcher = launcher_words(o.launcher, world);
    const std::string self = self_path();
    how.bench = own_modes ? std::vector<std::string>{self, "bench"}
                          : std::vector<std::string>{(std::filesystem::path(self).parent_path() / "zshard-bench").string()};
    how.common = common_flags(o);
    how.warmup_steps = o.warmup_steps;
    how.steps = o.steps;
    how.hosts = o.hosts;
    const WorkDir work(o.work_dir);
    how.work_dir = work.path();
    TuneSearch search(problem, space, how, {o.top, o.exhaustive, o.rank_batches == "detect", time_budget, o.repeats});

    std::cout << "zshard-tune: " << o.model << " (" << num_params(*model) << " parameters), " << world << " ranks"
              << (problem.hosts.empty() ? "" : " on hosts " + join_sizes(problem.hosts)) << ", global batch "
              << o.global_batch << "x" << o.seq << ", budget " << format_bytes(double(budget.bytes)) << " per rank ("
              << budget.source << "), time budget " << time_budget << " s\n";
    catch_stop_signals();
    search.run(std::cout);
    search.print_table(std::cout);

    json doc = search.to_json();
    doc.update({{"tool", "zshard-tune"},
                {"model", {{"name", o.model}, {"config", model_config(o.model, o.overrides)}, {"params", num_params(*model)}}},
                {"world", world},
                {"hosts", o.hosts},
                {"global_batch", o.global_batch},
                {"seq", o.seq},
                {"launcher", how.launcher},
                {"steps", o.steps},
                {"warmup_steps", o.warmup_steps},
                // The runs' logs stay in --work-dir; a temporary one is removed.
                {"work_dir", work.temporary() ? json(nullptr) : json(work.path())}});
    const std::string launcher_failure = search.launcher_failure();
    if (const TuneSearch::Entry* best = search.winner()) {
      const std::string cmd = shell_line(train_command(how, best->c, own_modes));
      std::cout << "fastest that fits: " << best->c.label() << ", " << std::fixed << std::setprecision(1)
                << best->run->measured.step_ms << " ms per step, peak " << format_bytes(double(best->run->peak_bytes)) << " of "
                << format_bytes(double(budget.bytes)) << "\n  " << cmd << "\n";
      doc["winner"] = {{"label", best->c.label()}, {"step_ms", best->run->measured.step_ms},
                       {"peak_bytes", best->run->peak_bytes}, {"command", cmd}};
    } else if (launcher_failure.empty()) {
      std::cout << "no candidate ran to the end within the budget\n";
    }
    if (!o.json_path.empty()) write_file_atomically(o.json_path, doc.dump(2) + "\n");
    if (stop_requested()) {
      std::cerr << "zshard-tune: stopped by a signal\n";
      return 130;
    }
    if (!launcher_failure.empty()) fail(launcher_failure);
    return search.winner() ? 0 : 1;
  });
}

}  // namespace zshard
