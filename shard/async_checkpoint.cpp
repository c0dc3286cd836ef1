#include "shard/async_checkpoint.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include <sys/resource.h>
#include <unistd.h>

#include "comm/agreed_failure.h"
#include "comm/launch.h"
#include "kernels/device_memory.h"
#include "kernels/test_hooks.h"
#include "shard/engine_internals.h"

namespace zshard {

namespace {

void maybe_slow_writer() {  // ZSHARD_TEST_SLOW_WRITER
  std::this_thread::sleep_for(std::chrono::milliseconds(test_hooks().slow_writer_ms));
}

}  // namespace

void enter_background_priority() {
  // Linux gives each thread a nice value of its own: this one alone is lowered. Failing leaves it as it was.
  if (comm::cores_to_spare()) setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 19);
}

AsyncCheckpoint::AsyncCheckpoint(Engine& engine, comm::Communicator& world, std::string dir, nlohmann::json run)
    : engine_(engine), world_(world), dir_(std::move(dir)), run_(std::move(run)), step_(engine.steps_done()) {
  prepare_step_dir(world_, dir_, engine_.plan().groups.size(0), step_);
  ShardedParams& params = EngineInternals::params(engine_);
  const bool writes = world_.rank() < engine_.plan().groups.size(0);
  std::vector<FlatLayout> layouts;
  std::vector<ShardState> units;
  run_agreed(world_, [&] {
    if (!writes) return;
    bool on_host = true;
    std::vector<std::array<Tensor, kStateKinds>> states;
    for (int u = 0; u < params.num_units(); ++u) {
      layouts.push_back(params.layout(u));
      const std::array<Tensor, kStateKinds>& state = states.emplace_back(owned_state(params, u));
      for (const Tensor& t : state) on_host = on_host && t.device() == Device::cpu;
      units.push_back({state[0].data<float>(), state[1].data<float>(), state[2].data<float>()});
    }
    if (on_host) {
      // Written where it lives; AdamW copies what the writer has not reached when it gets there first.
      in_place_ = std::make_unique<CopyOnUpdate>(params);
      return;
    }
    snapshot_ = std::make_unique<Buffer>(size_t(checkpoint_snapshot_bytes(layouts, 0)), Device::cpu, Category::host);
    // The copy, device to page-locked host memory on cuda, is what the step waits for; the file is not.
    auto* dst = static_cast<char*>(snapshot_->data());
    for (size_t u = 0; u < states.size(); ++u) {
      const auto* src = reinterpret_cast<const float*>(dst);
      for (const Tensor& t : states[u]) {
        copy_bytes(dst, Device::cpu, t.raw(), t.device(), t.nbytes());
        dst += t.nbytes();
      }
      const int64_t n = layouts[u].shard_numel();
      units[u] = {src, src + n, src + 2 * n};
    }
  });
  if (!writes) {
    written_ = true;
    return;
  }
  writer_ = std::thread([this, layouts = std::move(layouts), units = std::move(units), shard = params.shard_index()] {
    write(layouts, units, shard);
  });
}

AsyncCheckpoint::~AsyncCheckpoint() {
  if (writer_.joinable()) writer_.join();
}

void AsyncCheckpoint::write(const std::vector<FlatLayout>& layouts, const std::vector<ShardState>& units, int shard) {
  enter_background_priority();
  try {
    maybe_slow_writer();
    file_ = write_rank_file(dir_, shard, layouts, units, in_place_.get());
  } catch (const std::exception& e) {
    error_ = e.what();
  }
  if (in_place_) in_place_->writer_finished();
  written_.store(true, std::memory_order_release);
}

bool AsyncCheckpoint::written() {
  if (!written_.load(std::memory_order_acquire)) return false;
  if (writer_.joinable()) writer_.join();
  // Written: the host copy is no longer needed, nor is AdamW to be held for it.
  snapshot_.reset();
  in_place_.reset();
  return true;
}

void AsyncCheckpoint::abandon() {
  if (writer_.joinable()) writer_.join();
  snapshot_.reset();
  in_place_.reset();  // while the engine's parameters, which it guards, still exist
  abandoned_ = true;
}

int64_t AsyncCheckpoint::commit() {
  if (abandoned_)
    fail("the save into ", dir_, " was given up: its engine was destroyed before the save was waited for");
  if (writer_.joinable()) writer_.join();
  written();  // releases the host copy
  // The gather doubles as the barrier: every rank file is in place before the manifest is written.
  const FileReport mine = file_report(file_, !error_.empty());
  std::vector<FileReport> all(size_t(world_.size()));
  world_.all_gather(mine.data(), all.data(), kFileReportFields, DType::i32)->wait();
  const auto failed = std::find_if(all.begin(), all.end(), report_failed);
  if (failed != all.end()) {
    std::error_code ignored;  // the failure being reported matters more than a leftover directory
    if (world_.rank() == 0) std::filesystem::remove_all(dir_, ignored);
    if (!error_.empty()) throw AgreedFailure(error_, 1, failed - all.begin() == world_.rank());
    throw AgreedFailure("another rank failed", 1, false);
  }
  return commit_step_dir(engine_, world_, dir_, step_, all, std::move(run_));
}

AsyncSave::AsyncSave(Engine& engine, std::unique_ptr<AsyncCheckpoint> save)
    : engine_(&engine), save_(std::move(save)), step_(save_->step()), dir_(save_->dir()) {
  engine.state_->save_in_flight_ = save_.get();
}

AsyncSave::AsyncSave(AsyncSave&& other) noexcept = default;

AsyncSave& AsyncSave::operator=(AsyncSave&& other) noexcept {
  if (this == &other) return *this;
  release();
  engine_ = other.engine_;
  save_ = std::move(other.save_);
  step_ = other.step_;
  dir_ = std::move(other.dir_);
  bytes_ = other.bytes_;
  return *this;
}

AsyncSave::~AsyncSave() { release(); }

void AsyncSave::release() {
  if (!save_) return;
  // An abandoned save's engine may be gone (its destructor abandons it): not touched then.
  if (!save_->abandoned()) {
    AsyncCheckpoint*& in_flight = engine_->state_->save_in_flight_;
    if (in_flight == save_.get()) in_flight = nullptr;
  }
  save_.reset();  // joins the writer
}

bool AsyncSave::test() {
  if (save_ && !save_->abandoned()) {
    // Whether every rank's writer is done: then wait() commits at once.
    double written = save_->written() ? 1 : 0;
    comm::all_reduce_sum(engine_->world(), &written, 1);
    if (written < engine_->world().size()) return false;
  }
  wait();
  return true;
}

int64_t AsyncSave::wait() {
  if (bytes_ >= 0) return bytes_;
  if (!save_) fail("AsyncSave: no save in flight (the handle was moved from, or its save failed)");
  try {
    bytes_ = save_->commit();
  } catch (...) {
    release();
    throw;
  }
  release();
  return bytes_;
}

int64_t AsyncSave::snapshot_bytes() const { return save_ ? save_->snapshot_bytes() : 0; }

}  // namespace zshard
