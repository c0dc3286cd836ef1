// Engine::save, save_async and load: the engine's state in the checkpoint format
// (shard/checkpoint_format.h), written by the first shard group and read back, resharded, by any world.

#include <array>
#include <chrono>
#include <deque>
#include <filesystem>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include <zshard/engine.h>

#include "comm/agreed_failure.h"
#include "kernels/device_memory.h"
#include "kernels/io/atomic_file.h"
#include "kernels/test_hooks.h"
#include "shard/async_checkpoint.h"
#include "shard/checkpoint_commit.h"
#include "shard/checkpoint_format.h"
#include "shard/engine_state.h"
#include "shard/engine_internals.h"
#include "shard/sharded_params.h"

namespace zshard {

namespace fs = std::filesystem;

namespace {

void maybe_pause_in_save() {  // ZSHARD_TEST_PAUSE_IN_SAVE
  std::this_thread::sleep_for(std::chrono::milliseconds(test_hooks().pause_in_save_ms));
}

// Checkpoint files are read and written in host memory: a host shard in place, a device shard through a
// host copy, fetched before a save and put back after a load.
class HostShard {
 public:
  explicit HostShard(Tensor shard) : shard_(std::move(shard)) {
    if (shard_.device() != Device::cpu) copy_.resize(size_t(shard_.numel()));
  }
  float* data() { return copy_.empty() ? shard_.data<float>() : copy_.data(); }
  HostShard& fetch() {
    if (!copy_.empty()) copy_bytes(copy_.data(), Device::cpu, shard_.raw(), shard_.device(), shard_.nbytes());
    return *this;
  }
  void put_back() {
    if (!copy_.empty()) copy_bytes(shard_.raw(), shard_.device(), copy_.data(), Device::cpu, shard_.nbytes());
  }

 private:
  Tensor shard_;
  std::vector<float> copy_;  // empty for a host shard (a shard is never empty)
};

// The caller's run state, kept in the manifest: a JSON object, or the save fails on every rank.
nlohmann::json parse_run_json(comm::Communicator& world, const std::string& run_json) {
  nlohmann::json run;
  run_agreed(world, [&] {
    try {
      run = nlohmann::json::parse(run_json);
    } catch (const nlohmann::json::exception& e) {
      refuse("Engine::save: run_json is not JSON (", e.what(), ")");
    }
    if (!run.is_object()) refuse("Engine::save: run_json must be a JSON object, got ", run.dump());
  });
  return run;
}

}  // namespace

std::array<Tensor, 3> owned_state(const ShardedParams& params, int unit) {
  return {params.owned_params(unit), params.adam_m(unit), params.adam_v(unit)};
}

void prepare_step_dir(comm::Communicator& world, const std::string& dir, int writers, int step) {
  run_agreed(world, [&] {
    if (world.rank() != 0) return;
    // A directory named for a step is that step's: the newest-checkpoint search goes by the name, and a
    // load refuses a manifest of another step there.
    if (const std::optional<int> dir_step = step_of_dir(dir); dir_step && *dir_step != step)
      refuse(dir, ": named for step ", *dir_step, ", but the state is of step ", step,
             ": save into a directory of its own step's name (", step_dir_name(step), "), or of no step's");
    std::error_code ec;
    // A symbolic link goes, not what it points to: a save writes only into --save-dir.
    if (fs::is_symlink(fs::symlink_status(dir, ec))) fs::remove(dir, ec);
    // Uncommitting a checkpoint would lose it before the new one is whole.
    if (fs::exists(fs::path(dir) / kManifestFile, ec))
      fail(dir, " holds a committed checkpoint: save into a new directory, or remove it first");
    fs::create_directories(dir, ec);
    if (ec) fail(dir, ": cannot create (", ec.message(), ")");
    // Uncommitted before any of its files is written over, and durably so.
    if (fs::remove(fs::path(dir) / kManifestFile, ec)) sync_dir(dir);
    if (ec) fail(dir, ": cannot uncommit (", ec.message(), ")");
    std::set<std::string> rank_files;
    for (int shard = 0; shard < writers; ++shard) rank_files.insert(rank_file_name(shard));
    std::vector<fs::path> doomed;
    for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec))
      if (!rank_files.count(entry.path().filename().string())) doomed.push_back(entry.path());
    for (size_t i = 0; i < doomed.size() && !ec; ++i) fs::remove_all(doomed[i], ec);
    if (ec) fail(dir, ": cannot remove what an earlier save left (", ec.message(), ")");
  });
}

FileReport file_report(const CheckpointFile& file, bool failed) {
  return {int32_t(file.checksum), int32_t(file.checksum >> 32), int32_t(file.bytes), int32_t(file.bytes >> 32),
          failed ? 1 : 0};
}

bool report_failed(const FileReport& report) { return report[4] != 0; }

int64_t commit_step_dir(Engine& engine, comm::Communicator& world, const std::string& dir, int step,
                        const std::vector<FileReport>& reports, nlohmann::json run) {
  const auto u64 = [](int32_t lo, int32_t hi) { return uint64_t(uint32_t(lo)) | uint64_t(uint32_t(hi)) << 32; };
  const ShardPlan& plan = engine.plan();
  ShardedParams& params = EngineInternals::params(engine);
  const Manifest::Frozen frozen_record{EngineInternals::frozen_source(engine),
                                       EngineInternals::frozen_fingerprint(engine), params.frozen_numel()};
  int64_t total_bytes = 0;
  for (int r = 0; r < plan.groups.size(0); ++r) total_bytes += int64_t(u64(reports[size_t(r)][2], reports[size_t(r)][3]));
  run_agreed(world, [&] {
    if (world.rank() != 0) return;
    Manifest m;
    m.step = step;
    m.group_size = plan.groups.size(0);
    m.pad_multiple = plan.groups.pad_multiple();
    m.units = params.trainable_units();
    m.frozen = frozen_record;
    for (int r = 0; r < m.group_size; ++r) {
      const FileReport& f = reports[size_t(r)];
      m.files.push_back({rank_file_name(r), u64(f[2], f[3]), u64(f[0], f[1])});
    }
    m.run = std::move(run);
    maybe_pause_in_save();
    try {
      sync_dir(dir);
      commit_manifest(dir, m);
      sync_dir(parent_dir(dir));  // the step directory's own name (made, or renamed from a spare) too
    } catch (...) {
      // A manifest that could not be written (a full disk) leaves rank files no checkpoint owns: they go,
      // as after a rank file's failure. A committed one stays, though its directory's name is not durable.
      std::error_code ignored;
      if (!is_committed(dir)) fs::remove_all(dir, ignored);
      throw;
    }
  });
  return total_bytes;
}

int64_t Engine::save(const std::string& dir, const std::string& run_json) {
  ShardedParams& params = *state_->params_;
  nlohmann::json run = parse_run_json(world_, run_json);
  prepare_step_dir(world_, dir, plan_.groups.size(0), state_->steps_done_);
  // The first shard group writes: world ranks 0..G-1, whose shard index is their rank. A rank file that
  // cannot be written (a full disk, a NaN in the state) takes the directory with it, so that no partial
  // checkpoint is left behind.
  CheckpointFile file;
  try {
    run_agreed(world_, [&] {
      if (world_.rank() >= plan_.groups.size(0)) return;
      std::vector<FlatLayout> layouts;
      std::vector<ShardState> units;
      std::deque<HostShard> host;  // what the file is written from
      for (int u = 0; u < params.num_units(); ++u) {
        layouts.push_back(params.layout(u));
        float* data[3];
        const std::array<Tensor, 3> state = owned_state(params, u);
        for (size_t k = 0; k < state.size(); ++k) data[k] = host.emplace_back(state[k]).fetch().data();
        units.push_back({data[0], data[1], data[2]});
      }
      file = write_rank_file(dir, params.shard_index(), layouts, units);
    });
  } catch (const AgreedFailure&) {
    std::error_code ignored;  // the failure being reported matters more than a leftover directory
    if (world_.rank() == 0) fs::remove_all(dir, ignored);
    throw;
  }
  // The gather doubles as the barrier: every rank file is in place before the manifest is written.
  const FileReport mine = file_report(file, false);
  std::vector<FileReport> all(size_t(world_.size()));
  world_.all_gather(mine.data(), all.data(), kFileReportFields, DType::i32)->wait();
  return commit_step_dir(*this, world_, dir, state_->steps_done_, all, std::move(run));
}

AsyncSave Engine::save_async(const std::string& dir, const std::string& run_json) {
  // Every rank holds the same save in flight, so every rank refuses alike. A writer of state in host memory
  // has the optimizer copy what it has not reached, and the optimizer serves one at a time.
  if (state_->save_in_flight_)
    fail("save_async: the save of step ", state_->save_in_flight_->step(), " into ", state_->save_in_flight_->dir(),
         " is in flight: wait() for it first");
  nlohmann::json run = parse_run_json(world_, run_json);
  return AsyncSave(*this, std::make_unique<AsyncCheckpoint>(*this, world_, dir, std::move(run)));
}

CheckpointInfo Engine::load(const std::string& dir) {
  ShardedParams& params = *state_->params_;
  Manifest manifest;
  run_agreed(world_, [&] {
    manifest = read_manifest(dir);
    check_units(dir, manifest, params.trainable_units());
  });
  // Every rank takes part in the fingerprint's collective whatever the manifest said.
  const std::string fingerprint = frozen_fingerprint();
  run_agreed(world_, [&] {
    // Bad input, as a wrong --init-from or --seed: exit code 2. Another count of frozen elements is
    // another model (a frozen parameter reshaped, or frozen by other patterns), whatever the source.
    const int64_t frozen = params.frozen_numel();
    if (manifest.frozen.params != frozen)
      refuse(dir, ": saved beside ", manifest.frozen.params, " frozen parameter elements, but this model freezes ",
             frozen, ": its frozen parameters' shapes or patterns differ from the saved run's");
    if (manifest.frozen.fingerprint != fingerprint)
      refuse(dir, ": saved beside frozen parameters from ", manifest.frozen.source, " (fingerprint ",
             manifest.frozen.fingerprint, "), but this model's are from ", state_->frozen_source_, " (fingerprint ",
             fingerprint, "): give it the same frozen weights (import_weights, --init-from) before loading");
    // Every rank checks that the files are there; rank r checksums files r, r + N, ... so each file is
    // read once.
    for (size_t s = 0; s < manifest.files.size(); ++s)
      verify_file(dir, manifest.files[s], int(s) % world_.size() == world_.rank());
  });
  // Gradients of a step in progress belong to the state about to be replaced: applied to the loaded one
  // they would make a step no run ever took. Dropped before the state changes: an offloaded optimizer's
  // gradients on their way to the host, or a CUDA graph's recording, would otherwise refuse or capture the
  // copies below. A loop recovering from a failed step loads and goes on.
  discard_step();
  run_agreed(world_, [&] {
    CheckpointReader reader(dir, manifest);
    for (int u = 0; u < params.num_units(); ++u) {
      const FlatLayout& layout = params.layout(u);
      const int64_t begin = layout.shard_begin(params.shard_index()), n = layout.shard_numel();
      params.before_owned_change(u);
      const std::array<Tensor, 3> state = owned_state(params, u);
      for (size_t k = 0; k < state.size(); ++k) {
        HostShard shard(state[k]);
        reader.read(u, kShardKinds[k], begin, n, shard.data());
        shard.put_back();
      }
    }
  });
  params.sync_resident_params();
  state_->steps_done_ = manifest.step;
  return {manifest.step, manifest.run.dump()};
}

void Engine::give_up_save_in_flight() {
  // Its writer joined while the state it reads still exists; its handle then refuses to commit.
  if (state_->save_in_flight_) state_->save_in_flight_->abandon();
}

}  // namespace zshard
