// How zshard-tune times one candidate: a short zshard-bench run of it alone, as its own job under the
// launcher (mpirun ...), in a session of its own with a deadline (child_process.h), and what it measured.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/planning/tune_cost.h"

namespace zshard {

struct CandidateLauncher {
  std::vector<std::string> launcher;  // e.g. mpirun --oversubscribe -np 4
  std::vector<std::string> bench;     // zshard-bench, or a binary of its own with its mode word: own_model bench
  std::vector<std::string> common;    // the model's, the sequence's, the device's and the data's flags
  int warmup_steps = 1;
  int steps = 3;
  std::string work_dir;  // each run's log and JSON
  std::vector<int> hosts;  // each host's ranks, as the candidates were planned (--hosts)

  // The job's command line for `c`, writing its JSON to `json_path`.
  std::vector<std::string> command(const Candidate& c, const std::string& json_path) const;
  // Steps a run of `c` takes (an auto split settles during two more warm-up steps).
  int steps_run(const Candidate& c) const;
};

struct CandidateRun {
  // ok; over budget (the measured peak exceeds it); out of memory; failed; timed out; stopped (the tool
  // was asked to stop).
  std::string status;
  std::string detail;  // why it failed: the run's error line
  std::string ended;       // how a failed run ended: "exited with code N" or "ended by signal N"
  std::string first_line;  // a failed run's first line of output: what a launcher that cannot start says
  MeasuredRun measured;
  int64_t peak_bytes = 0;    // the largest over the ranks
  std::vector<int> split;    // sequences per rank in the last step
  double wall_s = 0;
  std::string log_path;
  bool ok() const { return status == "ok"; }
  // Whether the estimator was wrong: it said the candidate fits, the run did not.
  bool against_estimator() const { return status == "over budget" || status == "out of memory"; }
};

// Runs candidate number `index` for at most `timeout_s` seconds and checks its peak against `budget`.
CandidateRun run_candidate(const CandidateLauncher& how, const Candidate& c, int index, double timeout_s,
                           int64_t budget);

}  // namespace zshard
