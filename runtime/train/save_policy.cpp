#include "runtime/train/save_policy.h"

#include <csignal>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <utility>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstring>

#include "comm/agreed_failure.h"
#include "comm/abort.h"
#include "kernels/io/atomic_file.h"
#include "models/config_json.h"
#include "models/lora.h"
#include "shard/memory/estimator.h"
#include "shard/async_checkpoint.h"
#include "shard/checkpoint_format.h"
#include "shard/plan_internals.h"

namespace zshard {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

// mpirun also ends the ranks of a failed job with SIGTERM: the flight recorder dumps first (with
// --trace-dir), and a rank that fails after it exits at once (comm/abort.h).
void on_stop_signal(int sig) {
  comm::note_termination_signal(sig);
  g_stop_signal = sig;
}

std::string manifest_path(const std::string& dir) { return (fs::path(dir) / kManifestFile).string(); }

// A pruned checkpoint's directory, uncommitted, kept between a prune and the next save. Writing over its
// rank files spares the file system allocating a checkpoint's worth of pages or blocks and freeing as many:
// on tmpfs a save of gpt2 124M at np 2 took a third of the time (benchmarks/RESULTS.md).
fs::path spare_dir(const std::string& save_dir) { return fs::path(save_dir) / "step-spare"; }

// What a checkpoint records of its model: the registry name and the configuration.
json model_json(const std::string& name, const ModelConfig& config) { return {{"name", name}, {"config", config}}; }

}  // namespace

json saved_model(const json& run) {
  const json& m = run.at("model");
  return m.contains("name") ? m : model_json(run.at("model_name").get<std::string>(), m.get<ModelConfig>());
}

namespace {

std::string describe_model(const json& m) {
  return m.at("name").get<std::string>() + " with " + config_text(m.at("config").get<ModelConfig>());
}

// Float flags are stored as the exact double of the float; shown as the float they were given as.
std::string flag_text(const json& v) {
  if (!v.is_number_float()) return v.dump();
  std::ostringstream os;
  os << float(v.get<double>());
  return os.str();
}

}  // namespace

void check_resume_dir(const std::string& dir) {
  std::error_code ec;
  const fs::file_type type = fs::status(dir, ec).type();
  if (type == fs::file_type::not_found) refuse("--resume ", dir, ": no such directory");
  if (ec) refuse("--resume ", dir, ": cannot read (", ec.message(), ")");
  if (type != fs::file_type::directory)
    refuse("--resume ", dir, ": not a directory (a checkpoint is the directory that holds its manifest.json)");
  if (fs::exists(manifest_path(dir), ec)) return;
  for (const CheckpointEntry& e : list_checkpoints(dir))
    if (e.committed)
      refuse("--resume ", dir, ": not a checkpoint but a directory of them (", e.path,
             "); resume its newest with --save-dir ", dir, " --resume latest");
  refuse("--resume ", dir, ": not a checkpoint (no ", kManifestFile,
         ": another directory, or a save that did not finish); --resume latest takes the newest committed one");
}

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  // SA_RESETHAND: a second signal of the same kind takes the default action and ends the process.
  sa.sa_flags = SA_RESTART | SA_RESETHAND;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

SavePolicy::SavePolicy(Trainer& trainer, std::ostream* out)
    : trainer_(trainer), world_(trainer.world()), out_(world_.rank() == 0 ? out : nullptr) {
  const SaveOptions& o = trainer.options().saves;
  std::string dir;
  Manifest manifest;
  std::vector<std::string> report;
  // --save-dir is made and locked before anything is read from it: a second run started beside this one
  // is refused rather than let both pass the checks below and then save into one directory.
  run_agreed(world_, [&] { create_save_dir(); });
  try {
    run_agreed(world_, [&] { check_resume(dir, manifest, report); });
    if (!dir.empty()) {
      trainer.engine().load(dir);
      if (trainer.options().data.rank_batches_auto) continue_split(manifest.run);
    }
  } catch (...) {
    remove_save_dir_made();
    throw;
  }
  if (!dir.empty()) {
    resumed_step_ = manifest.step;
    std::error_code ec;
    if (!o.save_dir.empty() && fs::equivalent(dir, fs::path(o.save_dir) / step_dir_name(manifest.step), ec))
      saved_step_ = manifest.step;
  }
  if (out_) for (const std::string& line : report) *out_ << "zshard-train: " << line << "\n";
}

void SavePolicy::check_resume(std::string& dir, Manifest& manifest, std::vector<std::string>& report) const {
  const SaveOptions& o = trainer_.options().saves;
  if (!o.resume.empty()) {
    dir = o.resume;
    if (dir == "latest") {
      const std::optional<CheckpointEntry> newest = newest_committed(o.save_dir);
      if (!newest) refuse("--resume latest: no committed checkpoint in --save-dir ", o.save_dir);
      dir = newest->path;
    } else {
      check_resume_dir(dir);
    }
    manifest = read_manifest(dir);
    report = compare_with_flags(dir, manifest);
  }
  check_save_dir(dir, manifest.step);
}

json SavePolicy::run_state(int step) const {
  const TrainOptions& o = trainer_.options();
  const DataOptions& d = o.data;
  const OptimizerOptions& opt = o.optimizer;
  const Placement& p = o.plan.placement;
  return {
      {"model", model_json(o.model.name, trainer_.config())},
      {"strategy", {{"kind", strategy_name(trainer_.plan().kind)},
                    {"shard_group", trainer_.plan().groups.describe()},
                    {"world_size", world_.size()}}},
      {"rank_batches", trainer_.rank_batches()},
      // Flags that decide what the next steps compute, by flag name: resuming with other values works
      // but no longer repeats the uninterrupted run, so the resume notes them.
      {"flags", {{"data", d.source}, {"batch", d.batch}, {"seq", d.seq}, {"grad-accum", d.grad_accum},
                 {"steps", opt.steps}, {"lr", opt.lr}, {"warmup", opt.warmup}, {"lr-schedule", opt.lr_schedule},
                 {"min-lr", opt.min_lr}, {"wd", opt.wd}, {"beta1", opt.beta1}, {"beta2", opt.beta2},
                 {"eps", opt.eps}, {"grad-clip", opt.grad_clip}, {"seed", o.model.seed},
                 {"device", device_name(p.device)},
                 {"param-dtype", dtype_flag(p.param_dtype)},
                 {"reduce-dtype", dtype_flag(p.reduce_dtype)}}},
      // Positions, all determined by the step count.
      {"lr_schedule_position", step},
      {"adam_step", step},
      {"data_position", {{"micro_steps", int64_t(step) * d.grad_accum}, {"sequences_per_micro_step", d.batch}}},
      {"rng", {{"seed", o.model.seed}, {"draws_after_init", 0}}},
  };
}

std::vector<std::string> SavePolicy::compare_with_flags(const std::string& dir, const Manifest& m) const {
  const json want = model_json(trainer_.options().model.name, trainer_.config());
  const json now = run_state(m.step);
  try {
    const json& saved = m.run;
    // The model's own plan reads both configurations' targets: a model without adapters has none to read.
    const auto* lora = dynamic_cast<const LoraModel*>(&trainer_.model());
    const auto comparable = [&](json model) {
      if (lora) model["config"] = lora->lora_plan().with_targeted_layers(model.at("config").get<ModelConfig>());
      return model;
    };
    if (comparable(saved_model(saved)) != comparable(want))
      refuse(manifest_path(dir), ": the checkpoint holds model ", describe_model(saved_model(saved)),
             ", the flags ask for ", describe_model(want));
    const json& s = saved.at("strategy");
    std::vector<std::string> lines = {detail::concat(
        "resumed from ", dir, " at step ", m.step, " (saved by ", s.at("kind").get<std::string>(), " on ",
        s.at("world_size").get<int>(), " rank(s))")};
    // A step's sequences are --batch x --grad-accum: cut into other micro-steps, it is the same step.
    const json& flags = saved.at("flags");
    const DataOptions& d = trainer_.options().data;
    const bool same_step = flags.value("batch", 0) * flags.value("grad-accum", 1) == d.batch * d.grad_accum;
    // A constant schedule never reads --steps: another value changes no step's rate.
    const bool constant = flags.value("lr-schedule", "") == "constant" && now.at("flags").at("lr-schedule") == "constant";
    for (const auto& [flag, value] : flags.items())
      if (now.at("flags").value(flag, json()) != value && !(same_step && (flag == "batch" || flag == "grad-accum")) &&
          !(constant && flag == "steps"))
        lines.push_back(detail::concat("note: --", flag, " was ", flag_text(value),
                                       " when saved; the run will not repeat the uninterrupted one"));
    if (const int steps = trainer_.options().optimizer.steps; m.step >= steps)
      lines.push_back(detail::concat("note: the checkpoint is at step ", m.step, " and --steps is ", steps,
                                     ": nothing is left to train (raise --steps to go on)"));
    return lines;
  } catch (const json::exception& e) {
    fail(manifest_path(dir), ": not a valid zshard manifest (", e.what(), ")");
  }
}

void SavePolicy::check_save_dir(const std::string& resume_dir, int resumed_step) const {
  const std::string& save_dir = trainer_.options().saves.save_dir;
  if (save_dir.empty()) return;
  for (const CheckpointEntry& e : list_checkpoints(save_dir)) {
    if (!e.committed) continue;  // an interrupted save: not a checkpoint, overwritten when reached
    std::error_code ec;
    if (resume_dir.empty())
      refuse("--save-dir ", save_dir, " already holds checkpoints (", e.path,
             "); continue them with --resume latest, or choose another directory");
    if (e.step > resumed_step || (e.step == resumed_step && !fs::equivalent(e.path, resume_dir, ec)))
      refuse("--save-dir ", save_dir, " holds ", e.path, ", which a save of this run would overwrite; ",
             "choose another directory");
  }
}

void SavePolicy::create_save_dir() {
  const std::string& save_dir = trainer_.options().saves.save_dir;
  if (save_dir.empty() || world_.rank() != 0) return;
  std::error_code ec;
  created_save_dir_ = fs::create_directories(save_dir, ec);
  if (ec) refuse("--save-dir ", save_dir, ": cannot create (", ec.message(), ")");
  // A directory made and removed, not the permission bits: root passes those, and a read-only mount or
  // /sys still refuses. Found here, not at the first save after hours of training.
  const fs::path probe = fs::path(save_dir) / (".zshard-probe." + std::to_string(::getpid()));
  fs::create_directory(probe, ec);
  if (ec) {
    remove_save_dir_made();
    refuse("--save-dir ", save_dir, ": cannot write into it (", ec.message(), ")");
  }
  fs::remove(probe, ec);
  lock_save_dir();
}

// One run a --save-dir: an flock on the directory itself (no file left behind), held by rank 0 until the
// run ends; zshard-run's relaunch finds it free, its previous job gone. On a network file system the lock
// holds on its own host only (NFS takes flock on a directory as local): a lock NFS kept for a lost host
// would stop every relaunch on the others, which a zshard-run's own lock guards already.
void SavePolicy::lock_save_dir() {
  const std::string& save_dir = trainer_.options().saves.save_dir;
  save_dir_lock_.fd = ::open(save_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (save_dir_lock_.fd >= 0 && flock(save_dir_lock_.fd, LOCK_EX | LOCK_NB) == 0) return;
  const int error = errno;
  if (error == EWOULDBLOCK) {
    created_save_dir_ = false;  // the directory is the other run's now, made by either
    refuse("--save-dir ", save_dir, ": another run is saving there; wait for it to end, or choose another directory");
  }
  // A file system without locks (Lustre mounted without flock): the run goes on.
  if (out_)
    *out_ << "zshard-train: note: cannot lock --save-dir " << save_dir << " (" << std::strerror(error)
          << "): nothing stops a second run from saving there\n";
}

void SavePolicy::remove_save_dir_made() const {
  const std::string& save_dir = trainer_.options().saves.save_dir;
  std::error_code ignored;
  if (world_.rank() == 0 && created_save_dir_ && fs::is_empty(save_dir, ignored)) fs::remove(save_dir, ignored);
}

SavePolicy::DirLock::~DirLock() {
  if (fd >= 0) ::close(fd);
}

void SavePolicy::continue_split(const json& run) {
  // Every rank reads the same manifest, so every rank decides alike.
  std::vector<int> saved;
  try {
    saved = run.value("rank_batches", std::vector<int>{});
  } catch (const json::exception&) {
    return;  // not a split: the even one
  }
  const std::vector<int>& caps = trainer_.rank_batch_caps();
  if (int(saved.size()) != world_.size()) return;  // another world: the even split
  int sum = 0;
  for (int r = 0; r < world_.size(); ++r) {
    if (saved[r] < 1 || saved[r] > caps[r]) return;
    sum += saved[r];
  }
  if (sum == trainer_.options().data.batch) trainer_.set_rank_batches(saved);
}

bool SavePolicy::after_step() {
  const bool go_on = agree_at_boundary();
  save_if_due();
  return go_on;
}

bool SavePolicy::save_due() const {
  const SaveOptions& o = trainer_.options().saves;
  return o.save_every > 0 && trainer_.steps_done() % o.save_every == 0;
}

void SavePolicy::save_if_due() {
  if (!save_due()) return;
  if (trainer_.options().saves.mode == SaveMode::async) start_async_save();
  else save();
}

bool SavePolicy::agree_at_boundary() {
  const SaveOptions& o = trainer_.options().saves;
  // Whether any rank has been signalled.
  std::error_code ec;
  const bool stop_file = world_.rank() == 0 && !o.stop_file.empty() && fs::exists(o.stop_file, ec);
  double stop = g_stop_signal != 0 || stop_file ? 1.0 : 0.0;
  comm::all_reduce_sum(world_, &stop, 1);
  // The save in flight commits at the first boundary where every rank has written its file, before this
  // step's line; a save due now waits for it (one in flight at most).
  commit_in_flight(save_due());
  if (stop == 0) return true;
  if (stop_file) fs::remove(o.stop_file, ec);  // the request is taken: a run resumed after it goes on
  if (out_)
    *out_ << "zshard-train: " << (stop_file ? "stop requested (--stop-file " + o.stop_file + ")" : "stop signal received")
          << "; stopping after step " << trainer_.steps_done()
          << (o.save_dir.empty() ? " (no --save-dir: nothing saved)" : "") << std::endl;  // zshard-run reads it
  return false;
}

int64_t SavePolicy::predicted_snapshot_bytes() const {
  if (!trainer_.options().saves.snapshots()) return 0;
  EstimateInput in;
  in.model = &trainer_.model();
  in.plan = trainer_.plan();
  in.group = 0;
  in.checkpoint_snapshot = true;
  in.freeze = trainer_.options().model.freeze;
  return estimate_memory(in).checkpoint_snapshot;
}

void SavePolicy::save() {
  finish_in_flight();
  const SaveOptions& o = trainer_.options().saves;
  const int step = trainer_.steps_done();
  if (o.save_dir.empty() || step == saved_step_) return;
  const std::string dir = step_dir_for_save(step);
  const auto started = std::chrono::steady_clock::now();
  int64_t bytes = 0;
  cleaning_up_failure([&] { bytes = trainer_.engine().save(dir, run_state(step).dump()); });
  committed(step, dir, started, bytes);
}

void SavePolicy::start_async_save() {
  const int step = trainer_.steps_done();
  if (step == saved_step_) return;
  finish_in_flight();  // one save in flight at most
  const std::string dir = step_dir_for_save(step);
  in_flight_started_ = std::chrono::steady_clock::now();
  cleaning_up_failure([&] { in_flight_ = trainer_.engine().save_async(dir, run_state(step).dump()); });
}

void SavePolicy::commit_in_flight(bool wait) {
  if (!in_flight_) return;
  // Taken out first: a save that fails is gone when its failure goes up.
  AsyncSave save = std::move(*in_flight_);
  in_flight_.reset();
  bool done = wait;
  int64_t bytes = 0;
  cleaning_up_failure([&] {
    done = done || save.test();
    if (done) bytes = save.wait();
  });
  if (!done) {
    in_flight_ = std::move(save);
    return;
  }
  committed(save.step(), save.dir(), in_flight_started_, bytes);
}

void SavePolicy::cleaning_up_failure(const std::function<void()>& save) const {
  try {
    save();
  } catch (const AgreedFailure&) {
    // A save that failed took its step's directory with it, so the newest checkpoint stays the last good
    // one; a --save-dir this run made for it goes too.
    remove_save_dir_made();
    throw;
  }
}

void SavePolicy::committed(int step, const std::string& dir, std::chrono::steady_clock::time_point started,
                           int64_t bytes) {
  run_agreed(world_, [&] {
    if (world_.rank() == 0) prune(step);
  });
  saved_step_ = step;
  if (out_)
    *out_ << "zshard-train: checkpoint " << dir << " saved (" << std::fixed << std::setprecision(1)
          << double(bytes) / (1 << 20) << " MiB, "
          << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() << " s)\n";
}

SavePolicy::~SavePolicy() {
  // Nothing is lost when a removal fails: what is left is uncommitted. A later run's prune tries a pruned
  // directory again; a spare is taken by the next save into this --save-dir, or removed at its run's end.
  const auto warn = [&](const std::string& what) {
    if (out_) *out_ << "zshard-train: warning: " << what << "\n";
  };
  try {
    finish_removing();
  } catch (const std::exception& e) {
    warn(e.what());
  }
  const std::string& save_dir = trainer_.options().saves.save_dir;
  if (world_.rank() != 0 || save_dir.empty()) return;
  const fs::path spare = spare_dir(save_dir);
  std::error_code ec;
  fs::remove_all(spare, ec);
  if (ec) warn(detail::concat(spare.string(), ": cannot remove (", ec.message(), ")"));
}

void SavePolicy::prune(int newest_step) {
  finish_removing();  // the listing must not see a directory half removed
  const SaveOptions& o = trainer_.options().saves;
  const std::vector<CheckpointEntry> entries = list_checkpoints(o.save_dir);
  std::vector<std::string> doomed;
  int kept = 0;
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    if (it->step >= newest_step) {
      kept += it->committed;
    } else if (!it->committed) {
      doomed.push_back(it->path);  // an interrupted save, older than a committed checkpoint
    } else if (o.keep > 0 && ++kept > o.keep) {
      // Uncommitted now: a crash before its files are gone leaves a directory that is not a checkpoint.
      // A symbolic link (a checkpoint kept elsewhere) loses only the link: what it points to stays whole.
      std::error_code ec;
      if (!fs::is_symlink(fs::symlink_status(it->path, ec))) {
        fs::remove(manifest_path(it->path), ec);
        sync_dir(it->path);
      }
      doomed.push_back(it->path);
    }
  }
  // Only an uncommitted directory of its own is recycled: one whose manifest could not be removed goes
  // to the remover, whose failure names it, and a link goes as a link.
  const fs::path spare = spare_dir(o.save_dir);
  std::error_code ec;
  if (!doomed.empty() && fs::symlink_status(doomed.front(), ec).type() == fs::file_type::directory &&
      !is_committed(doomed.front()) && !fs::exists(fs::symlink_status(spare, ec))) {
    fs::rename(doomed.front(), spare, ec);  // uncommitted under either name; the next commit syncs the names
    if (!ec) doomed.erase(doomed.begin());
  }
  if (doomed.empty()) return;
  remover_ = std::thread([this, doomed = std::move(doomed)] {
    enter_background_priority();
    for (const std::string& dir : doomed) {
      std::error_code ec;
      fs::remove_all(dir, ec);
      if (ec && remover_error_.empty()) remover_error_ = dir + ": cannot remove (" + ec.message() + ")";
    }
  });
}

std::string SavePolicy::step_dir_for_save(int step) const {
  const std::string& save_dir = trainer_.options().saves.save_dir;
  const fs::path dir = fs::path(save_dir) / step_dir_name(step);
  if (world_.rank() == 0) {
    const fs::path spare = spare_dir(save_dir);
    std::error_code ec;
    if (fs::symlink_status(spare, ec).type() == fs::file_type::directory && !fs::exists(fs::symlink_status(dir, ec)))
      fs::rename(spare, dir, ec);  // made durable by the commit (commit_step_dir)
  }
  return dir.string();
}

void SavePolicy::finish_removing() {
  if (remover_.joinable()) remover_.join();
  if (!remover_error_.empty()) fail(std::exchange(remover_error_, {}));
}

}  // namespace zshard
