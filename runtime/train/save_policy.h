// The save policy of a training run, on top of the engine's checkpoints (Engine::save/load, in the format
// of shard/checkpoint_format.h): --save-dir / --save-every (and a final save), --keep, --resume on any
// world size and strategy, and a clean stop on SIGTERM or SIGINT. A checkpoint holds the fp32 master
// parameters, Adam m and v and the step count; the step fixes the rest (LR schedule position, data
// position, AdamW bias correction; no random numbers are drawn after initialisation), so a resumed run
// repeats the uninterrupted one.
#pragma once
#include <chrono>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/train/trainer.h"
#include "shard/checkpoint_format.h"

namespace zshard {

class SavePolicy {
 public:
  // Checks --save-dir and --resume and, with --resume, loads the checkpoint into `trainer`, each rank
  // reading only the slices its new shards need. Bad input fails on every rank alike (AgreedFailure)
  // before any collective. Rank 0 reports to `out` (null: silent).
  SavePolicy(Trainer& trainer, std::ostream* out);
  // Waits for the removal of pruned checkpoints, and removes the spare directory; a removal that failed
  // is reported to `out` as a warning.
  ~SavePolicy();
  SavePolicy(const SavePolicy&) = delete;
  SavePolicy& operator=(const SavePolicy&) = delete;

  // The Trainer::run hook: agree_at_boundary, then save_if_due. Returns false once any rank has been
  // signalled.
  bool after_step();
  // The boundary's agreement: commits the save in flight (--save-mode async) at the first boundary where
  // every rank has written its file, and returns false once any rank has been signalled. Both are agreed
  // (all-reduced), so every rank commits and stops after the same step. Collective.
  bool agree_at_boundary();
  // Every --save-every steps: saves (sync), or starts the save (async). zshard-train logs the step between
  // the two halves, so that a logged step is never behind a committed checkpoint: a sync save commits
  // after its step's log line, an async one at a later boundary, before that boundary's line. Collective.
  void save_if_due();
  // Commits the save in flight, then saves the state after trainer.steps_done() steps into --save-dir
  // synchronously (a no-op without one, or when that step is already there). Collective.
  void save();
  // Waits for the save in flight and commits it. Collective.
  void finish_in_flight() { commit_in_flight(true); }
  // Host bytes of this rank's snapshot while an asynchronous save is in flight (0 when none).
  int64_t snapshot_bytes() const { return in_flight_ ? in_flight_->snapshot_bytes() : 0; }
  // The estimator's snapshot for a rank of the first shard group (0 without periodic asynchronous saves).
  int64_t predicted_snapshot_bytes() const;

  int resumed_step() const { return resumed_step_; }  // -1 when not resumed

 private:
  nlohmann::json run_state(int step) const;
  // Fails when the checkpoint's model is not the flags' one; returns the lines the resume reports (the
  // saved strategy, and flags that differ from the saved run's).
  std::vector<std::string> compare_with_flags(const std::string& dir, const Manifest& manifest) const;
  // --rank-batches auto: goes on with the checkpoint's split where it fits this run (same world and batch).
  void continue_split(const nlohmann::json& run);
  // Saving never overwrites a checkpoint: --save-dir may hold only what led to this run.
  void check_save_dir(const std::string& resume_dir, int resumed_step) const;
  // --resume's checkpoint (`dir`, found for `latest`), its manifest and the lines the resume reports.
  void check_resume(std::string& dir, Manifest& manifest, std::vector<std::string>& report) const;
  // Rank 0: makes --save-dir, checks that it can write there, and locks it (lock_save_dir).
  void create_save_dir();
  void lock_save_dir();
  void remove_save_dir_made() const;  // rank 0: --save-dir, when this run made it and it is still empty
  // Rank 0: uncommits the checkpoints --keep no longer keeps (and removes interrupted saves). The newest
  // of them becomes the spare directory, whose rank files the next save writes over; the others' files
  // are deleted on a thread of its own (remover_): freeing gigabytes takes the kernel a good part of a
  // step, which training need not wait for. The next prune waits for it, and reports its failure.
  void prune(int newest_step);
  void finish_removing();
  // The directory the save of `step` goes to. Rank 0 first moves the spare directory there, for the save
  // to write over its rank files. Never fails: where it cannot, the save writes new files.
  std::string step_dir_for_save(int step) const;
  bool save_due() const;  // this step is a --save-every point
  void start_async_save();
  // Commits the save in flight once every rank has written its file; `wait`: waiting for them. Collective.
  void commit_in_flight(bool wait);
  // Runs `save`; when it fails (AgreedFailure), removes a --save-dir this run made and left empty.
  void cleaning_up_failure(const std::function<void()>& save) const;
  // After the save of `step` into `dir`, started at `started`, has committed `bytes`: prunes and reports.
  void committed(int step, const std::string& dir, std::chrono::steady_clock::time_point started, int64_t bytes);

  Trainer& trainer_;
  comm::Communicator& world_;
  std::ostream* out_;
  int resumed_step_ = -1;
  int saved_step_ = -1;  // the step whose checkpoint is already in --save-dir
  bool created_save_dir_ = false;  // this run made --save-dir: a failed first save removes it again
  struct DirLock {
    int fd = -1;
    DirLock() = default;
    DirLock(const DirLock&) = delete;
    DirLock& operator=(const DirLock&) = delete;
    ~DirLock();
  } save_dir_lock_;  // rank 0: --save-dir, flocked for the run's life (lock_save_dir)
  // --save-mode async: the save in flight, and when it started.
  std::optional<AsyncSave> in_flight_;
  std::chrono::steady_clock::time_point in_flight_started_;
  std::thread remover_;
  std::string remover_error_;  // set by remover_, read once it is joined
};

// A manifest's model, {"name": registry name, "config": configuration}, from its run state; checkpoints
// written before the name moved into it kept it in "model_name". json::exception when it has none.
nlohmann::json saved_model(const nlohmann::json& run);

// --resume DIR names a checkpoint: refused as a bad value (exit 2) when there is nothing there, or when it
// is a directory of checkpoints (a --save-dir), which --resume latest reads.
void check_resume_dir(const std::string& dir);

// SIGTERM and SIGINT then only set a flag that SavePolicy::after_step acts on; a second signal of the same
// kind ends the process at once.
void install_stop_handlers();

}  // namespace zshard
