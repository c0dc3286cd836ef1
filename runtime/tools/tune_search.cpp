#include "runtime/tools/tune_search.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <ostream>
#include <sstream>

#include <zshard/error.h>

#include "runtime/process/child_process.h"

namespace zshard {
using nlohmann::json;

namespace {

constexpr int kCalibrationAttempts = 3;

std::string ms(double v) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << v;
  return os.str();
}

json calibration_json(const Calibration& c) {
  return {{"measured", c.measured},
          {"seconds_per_seq", c.seconds_per_seq},
          {"comm_bytes_per_ms", c.comm_bytes_per_ms},
          {"comm_ms_per_call", c.comm_ms_per_call},
          {"exposed_fraction", c.exposed_fraction},
          {"optimizer_ms_per_param", c.optimizer_ms_per_param}};
}

}  // namespace

TuneSearch::TuneSearch(const TuneProblem& problem, const TuneSpace& space, CandidateLauncher how,
                       TuneSettings settings)
    : problem_(problem), space_(space), how_(std::move(how)), settings_(settings),
      rates_(nominal_calibration(problem)), start_(std::chrono::steady_clock::now()) {
  add(enumerate_candidates(problem_, space_));
  if (std::any_of(entries_.begin(), entries_.end(), [](const Entry& e) { return e.fits; })) return;
  const Entry& least = *std::min_element(entries_.begin(), entries_.end(),
                                         [](const Entry& a, const Entry& b) { return a.estimate < b.estimate; });
  throw UsageError(detail::concat("--mem-budget ", format_bytes(double(problem_.budget)),
                                  " fits no candidate: the smallest, ", least.c.label(), ", needs ",
                                  format_bytes(double(least.estimate)), " per rank by the estimate"));
}

void TuneSearch::add(const std::vector<Candidate>& candidates) {
  for (const Candidate& c : candidates) {
    Entry e;
    e.c = c;
    e.estimate = estimate_candidate(problem_, c).total();
    e.fits = e.estimate <= problem_.budget && (!c.auto_split || int64_t(c.max_rank_batch) * problem_.world >= c.batch);
    entries_.push_back(e);
  }
}

double TuneSearch::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

std::vector<size_t> TuneSearch::ranked() const {
  std::vector<size_t> order;
  for (size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].fits) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return entries_[a].predicted.step_ms() < entries_[b].predicted.step_ms();
  });
  return order;
}

std::vector<TuneSearch::Entry*> TuneSearch::ranking() {
  for (Entry& e : entries_)
    if (e.fits) e.predicted = predict_step(problem_, e.c, rates_);
  std::vector<Entry*> order;
  for (size_t i : ranked()) order.push_back(&entries_[i]);
  return order;
}

// The top few of the ranking (every one with exhaustive). A candidate of the same strategy as one already
// picked, predicted within 0.5% of it, is a variant the model cannot tell from it (offload on the cpu,
// more micro-steps of ddp): the first, the simpler, stands for both.
std::vector<TuneSearch::Entry*> TuneSearch::pick(const std::vector<Entry*>& ranked) const {
  if (settings_.exhaustive) return ranked;
  std::vector<Entry*> picked;
  for (Entry* e : ranked) {
    const auto alike = [&](const Entry* p) {
      return p->c.kind == e->c.kind && p->c.groups == e->c.groups &&
             std::abs(p->predicted.step_ms() - e->predicted.step_ms()) <= 0.005 * p->predicted.step_ms();
    };
    if (int(picked.size()) == settings_.top) break;
    if (std::none_of(picked.begin(), picked.end(), alike)) picked.push_back(e);
  }
  return picked;
}

void TuneSearch::time(Entry& e, double timeout_s, std::ostream& out) {
  out << "  [" << ++runs_ << "] " << e.c.label() << (e.run ? " again" : "") << " (predicted "
      << ms(e.predicted.step_ms()) << " ms, estimate " << format_bytes(double(e.estimate)) << ") ... " << std::flush;
  CandidateRun r = run_candidate(how_, e.c, runs_, timeout_s, problem_.budget);
  if (r.peak_bytes > 0) out << ms(r.measured.step_ms) << " ms, peak " << format_bytes(double(r.peak_bytes)) << ", ";
  out << r.status << (r.detail.empty() ? "" : ": " + r.detail) << " (" << ms(r.wall_s) << " s)\n" << std::flush;
  if (r.peak_bytes > 0) e.step_runs.push_back(r.measured.step_ms);
  // The fastest run stands, with the largest peak of all; a run over the budget or out of memory decides.
  if (!e.run || r.against_estimator() || (r.ok() && e.run->ok() && r.measured.step_ms < e.run->measured.step_ms)) {
    if (e.run) r.peak_bytes = std::max(r.peak_bytes, e.run->peak_bytes);
    e.run = r;
  } else {
    e.run->peak_bytes = std::max(e.run->peak_bytes, r.peak_bytes);  // a slower run's peak counts too
  }
}

bool TuneSearch::time_within_budget(Entry& e, double startup_s, std::ostream& out) {
  const double left = settings_.time_budget_s - elapsed_s();
  const double step_ms = e.run ? e.run->measured.step_ms : e.predicted.step_ms();
  const double predicted_s = startup_s + how_.steps_run(e.c) * step_ms / 1e3;
  if (predicted_s > left) {
    out << "  " << e.c.label() << ": not run, its predicted " << ms(predicted_s) << " s exceed the " << ms(left)
        << " s left of --time-budget\n";
    return false;
  }
  time(e, std::min(left, std::max(60.0, 3 * predicted_s)), out);
  return true;
}

void TuneSearch::run(std::ostream& out) {
  out << "  " << entries_.size() << " candidates, "
      << std::count_if(entries_.begin(), entries_.end(), [](const Entry& e) { return e.fits; })
      << " fit the budget by the estimate\n" << std::flush;
  // The calibrating run: the first by nominal rates; a run that fails hands the turn to the next, up to
  // three (more would rather say that the launcher or the machine is broken).
  for (Entry* e : ranking()) {
    if (runs_ == kCalibrationAttempts) break;
    time(*e, settings_.time_budget_s - elapsed_s(), out);
    if (e->run->status == "timed out" && runs_ == 1)
      throw UsageError(detail::concat("--time-budget ", ms(settings_.time_budget_s), " s is too short for one run: ",
                                      e->c.label(), " was still running after ", ms(e->run->wall_s), " s"));
    if (e->run->peak_bytes > 0) {
      rates_ = calibrate(problem_, e->c, e->run->measured);
      calibrated_on_ = e;
      break;
    }
    if (stop_requested() || elapsed_s() >= settings_.time_budget_s) break;
  }
  if (!calibrated_on_) return;
  const CandidateRun& first = *calibrated_on_->run;
  const double startup_s = std::max(0.0, first.wall_s - how_.steps_run(calibrated_on_->c) * first.measured.step_ms / 1e3);
  if (settings_.detect_unequal && unequal_speeds(rates_)) {
    out << "  the ranks' speeds differ by more than 20%: --rank-batches auto joins the search\n";
    TuneSpace with_auto = space_;
    with_auto.auto_split = {true};
    add(enumerate_candidates(problem_, with_auto));
  }
  std::vector<Entry*> timed = {calibrated_on_};
  for (Entry* e : pick(ranking())) {
    if (e->run) continue;
    if (stop_requested()) return;
    if (time_within_budget(*e, startup_s, out)) timed.push_back(e);
  }
  // More rounds of the runs that measured, each in the other order than the last.
  std::erase_if(timed, [](const Entry* e) { return !e->run->ok(); });
  for (int round = 1; round < settings_.repeats && timed.size() > 1; ++round) {
    std::reverse(timed.begin(), timed.end());
    for (Entry* e : timed) {
      if (stop_requested()) return;
      time_within_budget(*e, startup_s, out);
    }
  }
}

const TuneSearch::Entry* TuneSearch::winner() const {
  const Entry* best = nullptr;
  for (const Entry& e : entries_)
    if (e.run && e.run->ok() && (!best || e.run->measured.step_ms < best->run->measured.step_ms)) best = &e;
  return best;
}

std::string TuneSearch::launcher_failure() const {
  const CandidateRun* first = nullptr;
  int failed = 0;
  for (const Entry& e : entries_) {
    if (!e.run) continue;
    if (e.run->status != "failed") return "";
    if (!first) first = &*e.run;
    ++failed;
  }
  if (!first) return "";
  std::string launcher;
  for (const std::string& word : how_.launcher) launcher += (launcher.empty() ? "" : " ") + word;
  const std::string tried =
      failed == 1 ? std::string("the one candidate tried") : detail::concat("each of the ", failed, " candidates tried");
  return detail::concat("the launcher failed on ", tried, ": '", launcher, "' ", first->ended,
                        first->first_line.empty() ? "" : ": " + first->first_line);
}

void TuneSearch::print_table(std::ostream& out) const {
  const std::vector<size_t> order = ranked();
  const Entry* best = winner();
  int timed = 0, misses = 0;
  out << "\n" << std::left << std::setw(5) << "rank" << std::setw(52) << "candidate" << std::right << std::setw(12)
      << "est MB" << std::setw(11) << "pred ms" << std::setw(11) << "meas ms" << std::setw(12) << "peak MB"
      << "  status\n";
  for (size_t i = 0; i < order.size(); ++i) {
    const Entry& e = entries_[order[i]];
    if (!e.run) continue;
    const CandidateRun& r = *e.run;
    ++timed;
    misses += r.against_estimator();
    out << std::left << std::setw(5) << i + 1 << std::setw(52) << e.c.label() << std::right << std::setw(12)
        << ms(double(e.estimate) / 1e6) << std::setw(11) << ms(e.predicted.step_ms()) << std::setw(11)
        << (r.peak_bytes > 0 ? ms(r.measured.step_ms) : "-") << std::setw(12)
        << (r.peak_bytes > 0 ? ms(double(r.peak_bytes) / 1e6) : "-") << "  " << r.status
        << (&e == best ? "  <- fastest" : "") << "\n";
  }
  out << "searched " << entries_.size() << " candidates, " << order.size() << " fit the budget, " << timed
      << " timed (" << runs_ << " runs) in " << ms(elapsed_s()) << " s; the estimator: " << misses << " of " << timed
      << " timed exceeded the budget or ran out of memory\n";
}

json TuneSearch::to_json() const {
  // Each fitting candidate's place in the calibrated ranking (1 = fastest predicted).
  std::vector<size_t> place(entries_.size(), 0);
  const std::vector<size_t> order = ranked();
  for (size_t i = 0; i < order.size(); ++i) place[order[i]] = i + 1;
  json candidates = json::array();
  int misses = 0;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    json j = {{"label", e.c.label()}, {"flags", e.c.train_flags()}, {"estimate_bytes", e.estimate}, {"fits", e.fits}};
    if (e.fits)
      j["predicted"] = {{"rank", place[i]},
                        {"compute_ms", e.predicted.compute_ms},
                        {"comm_ms", e.predicted.comm_ms},
                        {"optimizer_ms", e.predicted.optimizer_ms},
                        {"step_ms", e.predicted.step_ms()}};
    if (e.run) {
      const CandidateRun& r = *e.run;
      misses += r.against_estimator();
      j["run"] = {{"status", r.status}, {"wall_s", r.wall_s}, {"log", std::filesystem::path(r.log_path).filename()}};
      if (!r.detail.empty()) j["run"]["detail"] = r.detail;
      if (r.peak_bytes > 0)
        j["run"].update({{"step_ms", r.measured.step_ms}, {"peak_bytes", r.peak_bytes}, {"split", r.split},
                         {"seq_per_s", r.measured.seq_per_s}, {"step_ms_runs", e.step_runs}});
    }
    candidates.push_back(j);
  }
  json doc = {{"budget_bytes", problem_.budget},
              {"time_budget_s", settings_.time_budget_s},
              {"elapsed_s", elapsed_s()},
              {"calibration", calibration_json(rates_)},
              {"estimator_misses", misses},
              {"candidates", candidates}};
  if (calibrated_on_) doc["calibration"]["candidate"] = calibrated_on_->c.label();
  return doc;
}

}  // namespace zshard
