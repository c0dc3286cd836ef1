// An asynchronous checkpoint of an Engine (Engine::save_async; its AsyncSave owns one), in the format and
// files of Engine::save. Each rank of the first shard group has a writer thread of its own write its rank
// file (fp32 master, Adam m and v) while training goes on. State on a device is copied into host memory
// (Category::host: page-locked on cuda) at the step boundary and written from there. State in host memory
// is written where it lives: the next optimizer step copies only what the writer has not reached by then
// (shard/copy_on_update.h), so a writer that keeps up costs neither the copy nor its memory. The writer
// does file I/O only; every collective runs on the caller's thread, once the caller has agreed that every
// rank's writer is done (AsyncSave::test) or waits for them all (AsyncSave::wait): then the ranks gather
// what each wrote and rank 0 writes the manifest, the commit point. Until then the step directory holds
// no manifest and is not a checkpoint: a job killed at any moment leaves the newest committed checkpoint
// as it was, and a save given up leaves no collective behind.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <zshard/communicator.h>
#include <zshard/engine.h>
#include <zshard/memory.h>

#include "shard/checkpoint_commit.h"
#include "shard/checkpoint_format.h"
#include "shard/copy_on_update.h"

namespace zshard {

// Called first on a save's background threads (the writer, the removal of pruned checkpoints). Where the
// host has more CPUs than ranks they drop to the lowest priority, so that they run on the cores training
// leaves idle and never take one from it. Where every CPU runs a rank they keep the default: at the
// lowest priority they would hardly run until the next save point waits for them, and their writes would
// no longer use the time the ranks spend waiting in collectives.
void enter_background_priority();

class AsyncCheckpoint {
 public:
  // Collective: rank 0 makes `dir` ready (prepare_step_dir), then every rank of the first shard group
  // starts writing the engine's state after its steps_done() steps (copied first when it is on a device).
  // Fails like Engine::save (AgreedFailure) when the directory cannot be made.
  AsyncCheckpoint(Engine& engine, comm::Communicator& world, std::string dir, nlohmann::json run);
  // Waits for the writer; commits nothing (a checkpoint not committed is not one).
  ~AsyncCheckpoint();
  AsyncCheckpoint(const AsyncCheckpoint&) = delete;
  AsyncCheckpoint& operator=(const AsyncCheckpoint&) = delete;

  // Never blocks: whether this rank's writer is done (its host copy then released).
  bool written();
  // The engine is being destroyed before the save was waited for: waits for this rank's writer and lets
  // go of the engine's state; the save is then given up (commit() refuses it, nothing is committed).
  void abandon();
  bool abandoned() const { return abandoned_; }
  // Collective: waits for this rank's writer, then rank 0 writes the manifest from every rank's report,
  // and the bytes of the files are returned. When a rank's file failed, the step directory is removed and
  // every rank throws AgreedFailure, the failing rank's message (naming the file) reported.
  int64_t commit();

  int step() const { return step_; }
  const std::string& dir() const { return dir_; }
  // Host bytes of the copy held now: the whole snapshot, or what the optimizer step copied.
  int64_t snapshot_bytes() const {
    return snapshot_ ? int64_t(snapshot_->bytes()) : in_place_ ? in_place_->copied_bytes() : 0;
  }

 private:
  void write(const std::vector<FlatLayout>& layouts, const std::vector<ShardState>& units, int shard);

  Engine& engine_;
  comm::Communicator& world_;
  std::string dir_;
  nlohmann::json run_;
  int step_;
  // The writing ranks' copy of device state (params, m, v of every unit in turn), or, for host state,
  // the copies the optimizer makes ahead of the writer.
  std::unique_ptr<Buffer> snapshot_;
  std::unique_ptr<CopyOnUpdate> in_place_;
  // Set by the writer thread before `written_`; read by the caller's thread after it.
  CheckpointFile file_;
  std::string error_;
  std::atomic<bool> written_{false};
  bool abandoned_ = false;
  std::thread writer_;
};

}  // namespace zshard
