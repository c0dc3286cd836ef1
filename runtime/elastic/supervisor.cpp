#include "runtime/elastic/supervisor.h"

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "kernels/io/atomic_file.h"
#include "kernels/io/fixed_text.h"
#include "runtime/cli/memory_flags.h"
#include "runtime/cli/path_checks.h"
#include "runtime/elastic/batch_plan.h"
#include "runtime/elastic/hosts.h"
#include "runtime/elastic/run_log.h"
#include "runtime/process/child_process.h"
#include "runtime/train/save_policy.h"
#include "shard/checkpoint_format.h"
#include "shard/memory/estimator.h"
#include "shard/memory/fit_check.h"

namespace zshard::elastic {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

volatile std::sig_atomic_t g_signals = 0;  // SIGINT, SIGTERM and SIGHUP received

void on_signal(int) { g_signals = g_signals + 1; }

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string names_text(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& n : names) text += (text.empty() ? "" : ",") + n;
  return text.empty() ? "none" : text;
}

// The names of the hosts of `hosts` that `others` lacks, in order.
std::vector<std::string> names_not_in(const std::vector<Host>& hosts, const std::vector<Host>& others) {
  std::vector<std::string> names;
  for (const Host& h : hosts)
    if (std::find(others.begin(), others.end(), h) == others.end()) names.push_back(h.name);
  return names;
}

// The value of --FLAG in `command` (its last occurrence), or nothing.
std::optional<std::string> flag_value(const std::vector<std::string>& command, const std::string& flag) {
  std::optional<std::string> value;
  for (size_t i = 1; i < command.size(); ++i) {
    if (command[i] == flag && i + 1 < command.size()) value = command[i + 1];
    if (command[i].rfind(flag + "=", 0) == 0) value = command[i].substr(flag.size() + 1);
  }
  return value;
}

// Renames the damaged checkpoint DIR to DIR.damaged (.damaged-2, ... when taken): no longer a checkpoint's
// name, so --resume latest and --keep pass it by, and nothing of it is deleted.
std::string set_aside_damaged(const std::string& dir) {
  for (int k = 1;; ++k) {
    const std::string to = dir + ".damaged" + (k == 1 ? "" : "-" + std::to_string(k));
    std::error_code ec;
    if (fs::exists(to, ec)) continue;
    fs::rename(dir, to, ec);
    if (ec) fail("cannot set the damaged checkpoint ", dir, " aside as ", to, " (", ec.message(), ")");
    return to;
  }
}

// A restart: why, what it changed, and (once the relaunch has finished a step) how long it took.
struct Restart {
  json record;
  double failed_at = 0;
  bool recovered = false;
};

class Supervisor {
 public:
  explicit Supervisor(const LauncherOptions& o);
  int run();

 private:
  struct Outcome {
    int status = 0;
    bool stopped = false;  // by the launcher's own SIGINT/SIGTERM
    bool signalled = false;  // the job's rank 0 said a stop signal reached it (sent to mpirun, not to us)
    std::string resumed_from;  // the checkpoint of --save-dir the attempt resumed from, if any
    std::deque<std::string> stderr_tail;
  };
  std::vector<Host> answering() const;
  int64_t default_budget(const std::vector<Host>& hosts) const;
  Outcome run_attempt(const std::vector<Host>& hosts, const BatchPlan& plan, int attempt, Restart* restart);
  void note_steps(StepLogReader& reader, Restart* restart);
  void hold_save_dir();
  std::string step_log_path(int attempt) const {
    return (std::filesystem::path(state_dir_) / ("attempt-" + std::to_string(attempt) + ".jsonl")).string();
  }
  void keep_earlier_log();
  bool write_log() const;  // true once --log-json holds every step so far
  bool takes_init_from_again(const CheckpointEntry& checkpoint) const;
  BatchPlan plan_on(const std::vector<Host>& hosts);
  std::vector<Host> hosts_for_flags(std::vector<Host> hosts, const std::vector<Host>& before);
  bool resumes_own_checkpoint(const std::string& dir) const;
  void append_restart(const json& record) const;
  std::string newest_text() const;

  LauncherOptions o_;
  std::string probe_;
  TrainingRun run_;
  std::string save_dir_, log_json_, state_dir_;
  int64_t budget_ = 0;
  RunLog log_;
};

Supervisor::Supervisor(const LauncherOptions& o) : o_(o) {
  if (o_.command.empty()) refuse("give the training command after --");
  // mpirun would fail to start it on every attempt, which zshard-run would take for a lost job.
  if (!is_executable(o_.command.front()))
    refuse("the training command ", o_.command.front(), ": no such executable here");
  if (!is_executable(o_.mpirun)) refuse("--mpirun ", o_.mpirun, ": no such executable here");
  if (o_.min_ranks < 1) refuse("--min-ranks must be >= 1, got ", o_.min_ranks);
  if (o_.max_restarts < 0) refuse("--max-restarts must be >= 0, got ", o_.max_restarts);
  if (!(o_.probe_timeout_s > 0 && o_.probe_timeout_s <= 3600))
    refuse("--probe-timeout must be in (0, 3600] seconds, got ", o_.probe_timeout_s);
  if (o_.min_ranks > total_slots(o_.hosts))
    refuse("--min-ranks ", o_.min_ranks, " exceeds the ", total_slots(o_.hosts), " slots of the hosts (",
          host_list_text(o_.hosts), ")");
  run_ = read_training_flags(o_.command);
  const TrainOptions& t = run_.options;
  if (t.saves.save_dir.empty())
    refuse("the training command has no --save-dir: a relaunch resumes from its newest checkpoint there");
  if (t.data.auto_batch) refuse("the training command has --batch auto: give --batch N (a relaunch must keep the step)");
  if (!t.data.rank_batches.empty()) refuse("the training command has --rank-batches N,...: a list fits one world only");
  for (const char* own : {"--step-log", "--stop-file"})
    if (flag_value(o_.command, own)) refuse("the training command has ", own, ": zshard-run gives each attempt its own");
  save_dir_ = t.saves.save_dir;
  log_json_ = t.output.log_json;
  state_dir_ = (fs::path(save_dir_) / "zshard-run").string();
  // Checked before anything is made, by zshard-train's rule: a --log-json straight inside a --save-dir not
  // made yet needs no directory (the --save-dir is made below).
  if (!log_json_.empty() && !inside_dir_not_made_yet(log_json_, save_dir_)) check_output_path("--log-json", log_json_);
  // The command's own --resume is used until --save-dir holds a checkpoint: then checked before any launch.
  if (const std::optional<std::string> given = flag_value(o_.command, "--resume");
      given && *given != "latest" && !newest_committed(save_dir_)) {
    check_resume_dir(*given);
    try {
      read_manifest(*given);
    } catch (const DamagedCheckpoint&) {
      throw;  // exit 3, as the job's own resume would
    } catch (const Error& e) {
      refuse("--resume ", e.what());
    }
  }
  if (!o_.mem_budget.empty()) budget_ = parse_bytes(o_.mem_budget, "--mem-budget");
  probe_ = o_.probe.empty() ? default_probe(o_.probe_timeout_s) : o_.probe;
  std::error_code ec;
  fs::create_directories(state_dir_, ec);
  if (ec) refuse("--save-dir ", save_dir_, ": cannot create ", state_dir_, " (", ec.message(), ")");
  hold_save_dir();
  keep_earlier_log();
}

// One launcher, and the job it started, a --save-dir: a second would race the first's checkpoints and log.
// An flock on a file of the state directory, whose descriptor mpirun inherits (it is not close-on-exec):
// a job left running by a launcher killed outright holds it until the job ends.
void Supervisor::hold_save_dir() {
  const std::string lock = (fs::path(state_dir_) / "lock").string();
  const int fd = open(lock.c_str(), O_RDWR | O_CREAT, 0644);
  if (fd < 0) refuse("--save-dir ", save_dir_, ": cannot open ", lock, " (", std::strerror(errno), ")");
  if (flock(fd, LOCK_EX | LOCK_NB) == 0) return;  // held until this process and the jobs it starts end
  if (errno != EWOULDBLOCK) {  // a file system without locks (Lustre mounted without flock, NFS without lockd)
    std::cerr << "zshard-run: warning: cannot lock " << lock << " (" << std::strerror(errno)
              << "): nothing stops a second zshard-run on this --save-dir" << std::endl;
    return;
  }
  std::string holder;
  std::getline(std::ifstream(fs::path(state_dir_) / "job"), holder);
  refuse("--save-dir ", save_dir_, ": another zshard-run, or a job one started",
         holder.empty() ? "" : " (" + holder + ")", ", still runs on it; stop it, or wait for it to end");
}

// Run again over a --save-dir it left checkpoints in (after a stop, or a launcher that died), zshard-run
// goes on with the --log-json it wrote there: its steps up to the checkpoint resumed from are the run's.
// A launcher killed outright wrote none for its last attempt: that attempt's step log, left in the state
// directory, holds them. The step logs are replayed oldest first, each an attempt that resumed after the
// step before its first record, as the launcher that wrote them merged them.
void Supervisor::keep_earlier_log() {
  std::error_code ec;
  if (log_json_.empty() || !newest_committed(save_dir_)) return;
  std::vector<fs::path> step_logs;
  for (const fs::directory_entry& e : fs::directory_iterator(state_dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("attempt-") && name.ends_with(".jsonl") && e.is_regular_file(ec))
      step_logs.push_back(e.path());
  }
  std::sort(step_logs.begin(), step_logs.end(), [](const fs::path& a, const fs::path& b) {
    std::error_code ignored;
    return fs::last_write_time(a, ignored) < fs::last_write_time(b, ignored);
  });
  try {
    // A FIFO or a device is written in place and has nothing to read back (a FIFO's open would block).
    if (fs::is_regular_file(log_json_, ec)) {
      StepLogReader earlier(log_json_);
      for (const json& record : earlier.read_new()) log_.add(record);
    }
    for (const fs::path& path : step_logs) {
      StepLogReader attempt(path.string());
      const std::vector<json> records = attempt.read_new();
      if (records.empty()) continue;
      log_.begin_attempt(records.front().at("step").get<int>() - 1);
      for (const json& record : records) log_.add(record);
    }
    // Replayed once: kept, a later launch would replay them again after a --log-json that has gone past
    // them, and drop its newer steps.
    if (!step_logs.empty() && write_log())
      for (const fs::path& path : step_logs) fs::remove(path, ec);
  } catch (const std::exception& e) {
    log_ = RunLog();
    std::cerr << "zshard-run: warning: " << e.what() << "; --log-json starts over" << std::endl;
  }
}

int64_t Supervisor::default_budget(const std::vector<Host>& hosts) const {
  // What the job's own set-up check allows a rank of the fullest host, as this host sees it (the hosts of
  // a cluster are alike); where this host cannot tell (no GPU here), what the first world needs, which fits
  // since the job was sized for it.
  const std::vector<int> slots = host_slots(hosts);
  const int most = slots.empty() ? 1 : *std::max_element(slots.begin(), slots.end());
  MemoryBudget usable;
  try {
    usable = usable_memory(run_.options.plan.placement.device, most);
  } catch (const std::exception&) {
  }
  if (usable.bytes >= 0) return usable.bytes;
  return estimate_rank_bytes(run_, slots, run_.options.data.batch, run_.options.data.grad_accum);
}

std::vector<Host> Supervisor::answering() const {
  std::vector<std::string> names;
  for (const Host& h : o_.hosts) names.push_back(h.name);
  const std::vector<bool> up = probe_hosts(names, probe_, o_.probe_timeout_s);
  std::vector<Host> hosts;
  for (size_t i = 0; i < o_.hosts.size(); ++i)
    if (up[i]) hosts.push_back(o_.hosts[i]);
  return hosts;
}

std::string Supervisor::newest_text() const {
  const std::optional<CheckpointEntry> newest = newest_committed(save_dir_);
  return newest ? "the newest checkpoint is " + newest->path : "no checkpoint was committed";
}

bool Supervisor::write_log() const {
  if (log_json_.empty()) return false;
  // The job comes first, as zshard-train's own --step-log: a full disk loses a log, not the run. The next
  // write has every step again.
  try {
    write_file_atomically(log_json_, log_.text());
    return true;
  } catch (const std::exception& e) {
    std::cerr << "zshard-run: warning: " << e.what() << "; the run goes on" << std::endl;
    return false;
  }
}

// Whether a relaunch resuming from `checkpoint` takes --init-from again: a checkpoint holds the trained
// weights only, and names the frozen ones it was trained beside (a LoRA run's base, --freeze's, a model's
// own ParamSpec::frozen), which come from --init-from again. A manifest that cannot be read goes by the
// flags: the relaunch's load names the damage.
bool Supervisor::takes_init_from_again(const CheckpointEntry& checkpoint) const {
  if (freezes_parameters(run_.options.model)) return true;
  try {
    return read_manifest(checkpoint.path).frozen.params > 0;
  } catch (const std::exception&) {
    return false;
  }
}

// The batch plan on `hosts`. A relaunch that resumes where nothing is frozen loads the checkpoint alone
// (run_attempt drops --init-from): from the first checkpoint on, the plan counts no import.
BatchPlan Supervisor::plan_on(const std::vector<Host>& hosts) {
  const std::optional<CheckpointEntry> newest = newest_committed(save_dir_);
  if (newest && !takes_init_from_again(*newest)) run_.options.model.init_from.clear();
  return plan_batch(run_, host_slots(hosts), budget_);
}

// The hosts to launch on: those that answer, but without the ones answering again (not in `before`) when
// the flags cannot run on so many ranks (--batch below the world size, a --shard-group that does not divide
// it: plan_on's estimate places the groups) and could on the others.
std::vector<Host> Supervisor::hosts_for_flags(std::vector<Host> hosts, const std::vector<Host>& before) {
  const auto refusal = [&](const std::vector<Host>& on) -> std::string {
    try {
      const BatchPlan plan = plan_on(on);
      TrainOptions options = run_.options;
      options.data.batch = plan.batch;
      options.data.grad_accum = plan.grad_accum;
      validate_options(options, total_slots(on));
    } catch (const UsageError& e) {
      return e.what();
    }
    return "";
  };
  std::vector<Host> kept;
  for (const Host& h : hosts)
    if (std::find(before.begin(), before.end(), h) != before.end()) kept.push_back(h);
  if (kept.size() == hosts.size() || kept.empty()) return hosts;
  const std::string why = refusal(hosts);
  if (why.empty() || !refusal(kept).empty()) return hosts;  // the job's own line will say why
  std::cerr << "zshard-run: " << names_text(names_not_in(hosts, before)) << " answering again, not taken back: on " << total_slots(hosts)
            << " ranks " << why << std::endl;
  return kept;
}

// Whether `dir` is the checkpoint the command's own --resume names: not the launcher's to set aside.
bool Supervisor::resumes_own_checkpoint(const std::string& dir) const {
  const std::optional<std::string> given = flag_value(o_.command, "--resume");
  std::error_code ec;
  return given && *given != "latest" && fs::equivalent(*given, dir, ec);
}

void Supervisor::append_restart(const json& record) const {
  const fs::path path = fs::path(state_dir_) / "restarts.jsonl";
  std::ofstream out(path, std::ios::app);
  out << record.dump() << "\n";
  out.flush();
  if (!out)  // a full disk: the run goes on, its record said lost
    std::cerr << "zshard-run: warning: cannot append to " << path.string() << "; restart " << record.value("restart", 0)
              << "'s record is lost" << std::endl;
}

void Supervisor::note_steps(StepLogReader& reader, Restart* restart) {
  for (const json& record : reader.read_new()) {
    log_.add(record);
    if (restart && !restart->recovered) {
      restart->recovered = true;
      const double now = unix_now();
      restart->record["recovered_at"] = now;
      restart->record["recover_s"] = now - restart->failed_at;
      restart->record["first_step"] = record.at("step");
      append_restart(restart->record);
      std::cerr << "zshard-run: restart " << restart->record["restart"] << " recovered: step " << record.at("step")
                << " done " << fixed(now - restart->failed_at, 1) << " s after the failure" << std::endl;
    }
  }
}

Supervisor::Outcome Supervisor::run_attempt(const std::vector<Host>& hosts, const BatchPlan& plan, int attempt,
                                            Restart* restart) {
  std::vector<std::string> command = o_.command;
  const std::string step_log = step_log_path(attempt);
  set_flag(command, "--log-json", nullptr);  // the launcher writes it, merged across attempts
  set_flag(command, "--step-log", step_log.c_str());
  // A stop signal becomes this file, which the job's rank 0 looks for at every step boundary: mpirun would
  // pass SIGTERM on, but kill the ranks a second later (its odls_base_sigkill_timeout), in the middle of the
  // save a stop makes. A relaunch into the same --save-dir finds none.
  const std::string stop_file = (fs::path(state_dir_) / "stop").string();
  std::error_code stale;
  fs::remove(stop_file, stale);
  set_flag(command, "--stop-file", stop_file.c_str());
  Outcome outcome;
  const std::optional<CheckpointEntry> newest = newest_committed(save_dir_);
  int resumed_step = 0;
  if (newest) {
    set_flag(command, "--resume", "latest");
    outcome.resumed_from = newest->path;
    if (!takes_init_from_again(*newest)) set_flag(command, "--init-from", nullptr);
    resumed_step = newest->step;
  } else if (const std::optional<std::string> given = flag_value(command, "--resume"); given && *given != "latest") {
    resumed_step = read_manifest(*given).step;
  }
  if (plan.batch != run_.options.data.batch || plan.grad_accum != run_.options.data.grad_accum) {
    set_flag(command, "--batch", std::to_string(plan.batch).c_str());
    set_flag(command, "--grad-accum", std::to_string(plan.grad_accum).c_str());
  }
  std::vector<std::string> argv = {o_.mpirun, "--host", host_list_text(hosts), "-np", std::to_string(total_slots(hosts))};
  argv.insert(argv.end(), o_.mpirun_args.begin(), o_.mpirun_args.end());
  argv.insert(argv.end(), command.begin(), command.end());
  log_.begin_attempt(resumed_step);
  std::error_code ec;
  fs::remove(step_log, ec);  // a step log of an earlier launch of this --save-dir
  std::cerr << "zshard-run: attempt " << attempt << " on " << host_list_text(hosts) << " (" << total_slots(hosts)
            << " ranks), batch " << plan.batch << " x grad-accum " << plan.grad_accum << ", "
            << (resumed_step > 0 ? "after step " + std::to_string(resumed_step) : std::string("from the start"))
            << std::endl;

  Child child = spawn(argv, ChildOutput::pipes());
  // Named where a second launcher of this --save-dir looks (hold_save_dir): a job this launcher's death
  // left running is found by it.
  std::ofstream(fs::path(state_dir_) / "job") << "mpirun pid " << child.pid << " of zshard-run pid " << getpid()
                                              << "\n";
  StepLogReader reader(step_log);
  // The job's output passes through a whole line at a time, so that the launcher's own lines never land
  // inside a rank's; a line longer than a read's buffer goes on as it is.
  std::string partial[2];
  const auto forward = [&](int k, size_t bytes) {
    (void)!write(k == 0 ? STDOUT_FILENO : STDERR_FILENO, partial[k].data(), bytes);
    if (k == 0 && partial[k].find("zshard-train: stop signal received") < bytes) outcome.signalled = true;
    if (k == 1)
      for (size_t begin = 0, nl; begin < bytes; begin = nl + 1) {
        nl = std::min(partial[k].find('\n', begin), bytes);
        outcome.stderr_tail.push_back(partial[k].substr(begin, nl - begin));
        if (outcome.stderr_tail.size() > 200) outcome.stderr_tail.pop_front();
      }
    partial[k].erase(0, bytes);
  };
  int forwarded = 0, wait_status = 0;
  bool exited = false;
  auto exited_at = std::chrono::steady_clock::now();
  for (;;) {
    pollfd fds[2] = {{child.out, POLLIN, 0}, {child.err, POLLIN, 0}};
    poll(fds, 2, 100);
    for (int k = 0; k < 2; ++k) {
      int& fd = k == 0 ? child.out : child.err;
      if (fd < 0 || !(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[65536];
      const ssize_t n = read(fd, buf, sizeof buf);
      if (n <= 0) {
        close(fd);
        fd = -1;
        continue;
      }
      partial[k].append(buf, size_t(n));
      const size_t last_newline = partial[k].rfind('\n');
      if (last_newline != std::string::npos) forward(k, last_newline + 1);
      else if (partial[k].size() >= sizeof buf) forward(k, partial[k].size());
    }
    note_steps(reader, restart);
    if (g_signals > forwarded && !exited) {
      // The first signal asks the job to stop (the ranks save after their step); a second ends it.
      forwarded = g_signals;
      outcome.stopped = true;
      std::cerr << "zshard-run: stop signal: " << (forwarded == 1 ? "stopping the job" : "killing the job")
                << " (no restart)" << std::endl;
      if (forwarded > 1) {
        signal_session(child, SIGKILL);  // mpirun and every rank it started here
      } else if (!std::ofstream(stop_file)) {
        kill(child.pid, SIGTERM);  // no file to ask with: the ranks save what mpirun gives them time for
      }
    }
    if (!exited && waitpid(child.pid, &wait_status, WNOHANG) == child.pid) {
      exited = true;
      exited_at = std::chrono::steady_clock::now();
    }
    // A rank left behind on this host may hold the pipes open: its output is not waited for long.
    const bool drained = (child.out < 0 && child.err < 0) ||
                         (exited && std::chrono::steady_clock::now() - exited_at > std::chrono::seconds(2));
    if (exited && drained) break;
  }
  for (int fd : {child.out, child.err})
    if (fd >= 0) close(fd);
  for (int k = 0; k < 2; ++k) forward(k, partial[k].size());
  // A rank mpirun left behind on this host would hold its memory and could still write into --save-dir
  // while the next attempt starts: the attempt's session ends with mpirun.
  signal_session(child, SIGKILL);
  note_steps(reader, restart);
  fs::remove(stop_file, stale);
  outcome.status = exit_status(wait_status);
  return outcome;
}

int Supervisor::run() {
  std::vector<Host> hosts = answering();
  const std::vector<std::string> silent = names_not_in(o_.hosts, hosts);
  const std::string silent_text = names_text(silent) + " not answering (probe: " + probe_ + ")";
  if (total_slots(hosts) < o_.min_ranks || hosts.empty()) {
    std::cerr << "zshard-run: error: the hosts that answer (" << (hosts.empty() ? "none" : host_list_text(hosts))
              << ") hold " << total_slots(hosts) << " ranks, fewer than --min-ranks " << o_.min_ranks << "; "
              << silent_text << std::endl;
    return 1;
  }
  if (!silent.empty()) std::cerr << "zshard-run: " << silent_text << std::endl;
  if (budget_ == 0) budget_ = default_budget(hosts);
  BatchPlan plan = plan_on(hosts);
  // The budget never reaches the job (zshard-train's --mem-budget belongs to --batch auto, which a relaunch
  // cannot keep): its set-up check measures the machine instead, and would start the run this budget rules out.
  if (!plan.fits && !o_.mem_budget.empty())
    refuse("--mem-budget ", o_.mem_budget, ": no micro-batch fits on the ", total_slots(hosts), " ranks of ",
           host_list_text(hosts), ": the smallest, batch ", plan.batch, " x grad-accum ", plan.grad_accum, ", needs ",
           format_bytes(double(plan.rank_bytes)), " per rank by the estimate");

  std::optional<Restart> restart;
  // How a stopped job ends: 0 when its newest checkpoint is its last step, else 1.
  const auto stopped = [&] {
    const std::optional<CheckpointEntry> newest = newest_committed(save_dir_);
    std::cerr << "zshard-run: stopped after step " << log_.last_step() << "; " << newest_text() << std::endl;
    return newest && newest->step == log_.last_step() ? 0 : 1;
  };
  for (int attempt = 1;; ++attempt) {
    if (attempt > 1 && g_signals) {  // asked to stop between attempts: nothing to relaunch only to stop it
      std::cerr << "zshard-run: stop signal: not restarted" << std::endl;
      return stopped();
    }
    const int steps_before = log_.last_step();
    const Outcome outcome = run_attempt(hosts, plan, attempt, restart ? &*restart : nullptr);
    // Merged into --log-json: no later launcher replays it (keep_earlier_log), however its file times fall.
    if (std::error_code ignored; write_log()) fs::remove(step_log_path(attempt), ignored);
    if (restart && !restart->recovered) append_restart(restart->record);  // failed again before a step
    if (outcome.stopped) return stopped();
    if (outcome.signalled) {  // a stop meant for the job (mpirun's own exit status aside): nothing to restart
      std::cerr << "zshard-run: the job stopped on a signal sent to it, not to zshard-run: not restarted" << std::endl;
      return stopped();
    }
    if (outcome.status == 0) return 0;
    if (outcome.status == 2) {
      std::cerr << "zshard-run: error: the training command exited with 2 (its flags or input data: see the line above); "
                   "not restarted"
                << std::endl;
      return 2;
    }
    std::string set_aside;
    if (outcome.status == 3) {
      // The checkpoint the attempt resumed from is damaged: once set aside, the relaunch resumes from the
      // one before it. One the command names itself (its own --resume) is not the launcher's to move.
      if (outcome.resumed_from.empty() || resumes_own_checkpoint(outcome.resumed_from)) {
        std::cerr << "zshard-run: error: the checkpoint the training command resumes from is damaged (see the "
                     "line above); not restarted"
                  << std::endl;
        return 3;
      }
      set_aside = set_aside_damaged(outcome.resumed_from);
      if (!newest_committed(save_dir_)) {
        // Going back to the run's start would redo every step of a run that may have taken days: the
        // user's call.
        std::cerr << "zshard-run: error: the damaged " << outcome.resumed_from << " set aside as " << set_aside
                  << ", and no checkpoint is left to resume from; not restarted (run again to start over)"
                  << std::endl;
        return 3;
      }
    }
    const std::string aside_text =
        set_aside.empty() ? "" : "; the damaged " + outcome.resumed_from + " set aside as " + set_aside;
    const double failed_at = unix_now();
    const int last_step = log_.last_step();
    const std::vector<Host> before = hosts;
    hosts = answering();
    const std::vector<std::string> lost = names_not_in(before, hosts);
    const std::vector<std::string> tail(outcome.stderr_tail.begin(), outcome.stderr_tail.end());
    const std::string cause = failure_cause(tail, outcome.status);
    // mpirun's refusal of its own command line (an option it does not know), with every host still
    // answering and no step made: each relaunch would meet it again. (Its framed messages may be a
    // daemon's transient failure, and are retried.)
    if (launcher_refusal(cause) && lost.empty() && log_.last_step() == steps_before) {
      std::cerr << "zshard-run: error: mpirun refused the launch (" << cause << "); not restarted" << std::endl;
      return 1;
    }
    if (attempt > o_.max_restarts) {
      std::cerr << "zshard-run: error: the job failed (" << cause << "; hosts lost: " << names_text(lost)
                << ")" << aside_text << " and --max-restarts " << o_.max_restarts << " are spent; " << newest_text()
                << std::endl;
      return 1;
    }
    const std::vector<Host> answered = hosts;
    hosts = hosts_for_flags(hosts, before);
    // Answering again, but not taken back (the flags cannot run there); and taken back.
    const std::vector<std::string> left_out = names_not_in(answered, hosts), back = names_not_in(hosts, before);
    if (total_slots(hosts) < o_.min_ranks) {
      std::cerr << "zshard-run: error: the job failed (" << cause << "; hosts lost: " << names_text(lost)
                << ") and the hosts that answer (" << (hosts.empty() ? "none" : host_list_text(hosts)) << ") hold "
                << total_slots(hosts) << " ranks, fewer than --min-ranks " << o_.min_ranks << "; " << newest_text()
                << std::endl;
      return 1;
    }
    try {
      plan = plan_on(hosts);
    } catch (const UsageError& e) {  // the groups asked for do not fit the hosts left (node groups of one rank)
      std::cerr << "zshard-run: error: the job failed (" << cause << "; hosts lost: " << names_text(lost)
                << ") and on the hosts that answer (" << host_list_text(hosts) << ") its flags cannot run: " << e.what()
                << "; " << newest_text() << std::endl;
      return 1;
    }
    // Where the relaunch resumes: the newest checkpoint, else the command's own --resume, else the start.
    const std::optional<CheckpointEntry> newest = newest_committed(save_dir_);
    const std::optional<std::string> own = flag_value(o_.command, "--resume");
    int resumed = 0;
    std::string from = "starting over (no checkpoint)";
    if (newest) {
      resumed = newest->step;
      from = "resuming from " + newest->path;
    } else if (own && *own != "latest") {
      try {
        resumed = read_manifest(*own).step;
      } catch (const Error&) {  // the relaunch's own line will say why
      }
      from = "resuming from " + *own;
    }
    restart = Restart{{{"restart", attempt},
                       {"cause", cause},
                       {"exit_status", outcome.status},
                       {"hosts_lost", lost},
                       {"hosts_back", back},
                       {"hosts_left_out", left_out},
                       {"set_aside", set_aside.empty() ? json(nullptr) : json(set_aside)},
                       {"hosts", host_list_text(hosts)},
                       {"ranks", total_slots(hosts)},
                       {"last_step", last_step},
                       {"resumed_step", resumed},
                       {"steps_redone", std::max(0, last_step - resumed)},
                       {"batch", plan.batch},
                       {"grad_accum", plan.grad_accum},
                       {"failed_at", failed_at},
                       {"recovered_at", nullptr},
                       {"recover_s", nullptr},
                       {"first_step", nullptr}},
                      failed_at};
    std::cerr << "zshard-run: restart " << attempt << " of " << o_.max_restarts << ": " << cause
              << "; hosts lost: " << names_text(lost) << (back.empty() ? "" : "; hosts back: " + names_text(back))
              << aside_text
              << "; " << from << ", steps redone: " << std::max(0, last_step - resumed)
              << (plan.fits ? "" : "; warning: no micro-batch fits the memory budget, the job's own check decides")
              << std::endl;
  }
}

}  // namespace

int run_elastic(const LauncherOptions& options) {
  Supervisor supervisor(options);
  // Inside Slurm mpirun starts its daemons as a job step. A lost node's step stays in Slurm's books, its
  // CPUs taken, until Slurm marks the node down (SlurmdTimeout, minutes): the relaunch's step must not
  // wait for them. The user's own setting stays.
  if (std::getenv("SLURM_JOB_ID")) setenv("OMPI_MCA_plm_slurm_args", "--overlap", 0);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);  // a closed terminal: stopped as by SIGTERM, never the job left running alone
  signal(SIGPIPE, SIG_IGN);
  return supervisor.run();
}

}  // namespace zshard::elastic
