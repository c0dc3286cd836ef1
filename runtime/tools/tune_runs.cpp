#include "runtime/tools/tune_runs.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include <zshard/error.h>

#include "runtime/cli/json_input.h"
#include "runtime/process/child_process.h"
#include "shard/strategy_internals.h"

namespace zshard {

namespace {

// An auto split re-splits after every step while it is timed (it settles within two).
constexpr int kTuneRebalanceEvery = 1;

// Why a run failed, as it said it: its last error line (zshard's, not the launcher's notes after it),
// else its last line.
std::string failure_line(const std::string& path) {
  static const std::regex error("^zshard-bench: (error: |rank [0-9]+: )");
  std::ifstream in(path);
  std::string line, last, last_error;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    last = line;
    if (std::regex_search(line, error)) last_error = line;
  }
  return last_error.empty() ? last : last_error;
}

// The first line of a run's output that says something (mpirun frames its messages in rules of dashes).
std::string first_line_of(const std::string& path) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (std::any_of(line.begin(), line.end(), [](unsigned char c) { return std::isalnum(c); })) return line;
  return "";
}

// A run that failed for lack of memory: the memory check refused it, an allocation failed, or the kernel
// killed a rank (mpirun reports a rank ended by signal 9).
bool ran_out_of_memory(const std::string& path, const ChildResult& r) {
  if (r.signal == 9) return true;
  std::ifstream in(path);
  const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  static const std::regex oom("does not fit in memory|bad_alloc|out of memory|signal 9|Killed");
  return std::regex_search(log, oom);
}

}  // namespace

std::vector<std::string> CandidateLauncher::command(const Candidate& c, const std::string& json_path) const {
  std::vector<std::string> cmd = launcher;
  cmd.insert(cmd.end(), bench.begin(), bench.end());
  cmd.insert(cmd.end(), common.begin(), common.end());
  for (const std::string& flag : c.train_flags()) cmd.push_back(flag == "--strategy" ? "--strategies" : flag);
  if (c.auto_split) cmd.insert(cmd.end(), {"--rebalance-every", std::to_string(kTuneRebalanceEvery)});
  cmd.insert(cmd.end(), {"--warmup-steps", std::to_string(warmup_steps), "--steps", std::to_string(steps), "--json",
                         json_path});
  return cmd;
}

int CandidateLauncher::steps_run(const Candidate& c) const {
  return warmup_steps + steps + (c.auto_split ? 2 * kTuneRebalanceEvery : 0);
}

CandidateRun run_candidate(const CandidateLauncher& how, const Candidate& c, int index, double timeout_s,
                           int64_t budget) {
  const std::string stem = how.work_dir + "/candidate-" + std::to_string(index);
  CandidateRun run;
  run.log_path = stem + ".log";
  const std::string json_path = stem + ".json";
  std::remove(json_path.c_str());
  const ChildResult r = run_child(how.command(c, json_path), timeout_s, run.log_path);
  run.wall_s = r.wall_s;
  if (r.interrupted || r.timed_out) {
    run.status = r.interrupted ? "stopped" : "timed out";
    return run;
  }
  if (r.exit_code != 0) {
    run.status = ran_out_of_memory(run.log_path, r) ? "out of memory" : "failed";
    run.detail = failure_line(run.log_path);
    run.ended =
        r.signal ? detail::concat("ended by signal ", r.signal) : detail::concat("exited with code ", r.exit_code);
    run.first_line = first_line_of(run.log_path);
    if (run.detail.empty()) run.detail = run.ended;
    return run;
  }
  const nlohmann::json doc = read_json_file("candidate result", json_path);
  read_fields("candidate result", json_path, [&] {
    const nlohmann::json& res = doc.at("results").at(0);
    run.measured.step_ms = res.at("step_ms").at("median");
    run.measured.seq_per_s = res.at("measured_seq_per_s").get<std::vector<double>>();
    run.measured.comm_exposed_ms = res.at("comm_ms_per_step").at("exposed");
    run.measured.comm_total_ms = res.at("comm_ms_per_step").at("total");
    run.measured.comm_latency_ms = res.at("comm_ms_per_step").at("latency");
    run.peak_bytes = res.at("peak_total_bytes");
    run.split = res.at("split").get<std::vector<int>>();
    // The candidates' groups, secondary shards and budget are the --hosts layout's: a launcher that places
    // the ranks otherwise times other runs than it names, and would crown one that cannot run as planned.
    if (const std::vector<int> placed = doc.value("hosts", how.hosts); placed != how.hosts)
      refuse("--launcher placed the ranks on hosts of ", join_sizes(placed), ", but the candidates are planned for ",
             "hosts of ", join_sizes(how.hosts), " (--hosts, or --np on one host): give a launcher that places them ",
             "so (a hostfile), or --hosts as it places them");
    if (!doc.value("hosts_consecutive", true))
      refuse("--launcher placed a host's ranks apart (round-robin), but the candidates are planned for hosts of ",
             "consecutive ranks, as --hosts lists them: place them by slot (mpirun --map-by slot)");
  });
  run.status = run.peak_bytes > budget ? "over budget" : "ok";
  return run;
}

}  // namespace zshard
