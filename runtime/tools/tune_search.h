// zshard-tune's search over the candidates of one problem: prune by the estimate, rank by the cost model,
// calibrate it on the first run, time the top few, all within a time budget; then the table and JSON of
// every candidate and the fastest measured run that fits.
#pragma once
#include <chrono>
#include <deque>
#include <iosfwd>
#include <optional>

#include <nlohmann/json.hpp>

#include "runtime/tools/tune_runs.h"

namespace zshard {

struct TuneSettings {
  int top = 3;              // timed after the calibrating run
  bool exhaustive = false;  // time every candidate that fits
  bool detect_unequal = true;  // add auto splits when the calibrating run measures unequal rank speeds
  double time_budget_s = 900;
  // Each timed candidate runs this many times, in rounds of alternating order, and is judged by its
  // fastest run: on a machine that others load, one run can be slowed by half and more.
  int repeats = 2;
};

class TuneSearch {
 public:
  // Sizes every candidate of `space` by the estimate. Throws UsageError when none fits the budget, naming
  // the smallest and what it needs.
  TuneSearch(const TuneProblem& problem, const TuneSpace& space, CandidateLauncher how, TuneSettings settings);

  // The calibrating run, then the top few of the calibrated ranking; a progress line per run to `out`.
  // Throws UsageError when the time budget ends the first run. Returns early when stop_requested().
  void run(std::ostream& out);

  struct Entry {
    Candidate c;
    int64_t estimate = 0;
    bool fits = false;
    StepCost predicted;
    std::optional<CandidateRun> run;  // its fastest run (or one over the budget: that decides)
    std::vector<double> step_runs;    // every measured run's median step, in order
  };
  // The fastest run that ended within the budget; null when none did.
  const Entry* winner() const;
  // When every run made failed outright (none measured, ran out of memory, timed out or was stopped), the
  // line that says so: the launcher is broken, not the candidates. Empty otherwise.
  std::string launcher_failure() const;
  double elapsed_s() const;
  void print_table(std::ostream& out) const;
  nlohmann::json to_json() const;

 private:
  void add(const std::vector<Candidate>& candidates);
  // The fitting entries, fastest predicted first (ties keep the enumeration's order: simplest first), by
  // the predictions made last (ranked) or by the current rates (ranking).
  std::vector<size_t> ranked() const;
  std::vector<Entry*> ranking();
  std::vector<Entry*> pick(const std::vector<Entry*>& ranked) const;
  void time(Entry& e, double timeout_s, std::ostream& out);
  // Times `e` unless its predicted run time exceeds what is left of the budget; false if not run.
  bool time_within_budget(Entry& e, double startup_s, std::ostream& out);

  TuneProblem problem_;
  TuneSpace space_;
  CandidateLauncher how_;
  TuneSettings settings_;
  std::deque<Entry> entries_;  // appended to while pointers to its entries are held
  Calibration rates_;
  Entry* calibrated_on_ = nullptr;
  int runs_ = 0;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace zshard
