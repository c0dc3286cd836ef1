#include "shard/async_checkpoint.h"

#include <algorithm>
#include <filesystem>

#include <sys/resource.h>
#include <unistd.h>

#include "comm/agreed_failure.h"
#include "comm/launch.h"
#include "kernels/device_memory.h"
#include "kernels/test_hooks.h"
#include "shard/sharded_params.h"

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

int64_t checkpoint_snapshot_bytes(const std::vector<FlatLayout>& layouts, int group) {
  if (group != 0) return 0;
  int64_t floats = 0;
  for (const FlatLayout& layout : layouts) floats += kStateKinds * layout.shard_numel();
  return floats * int64_t(sizeof(float));
}

AsyncCheckpoint::AsyncCheckpoint(Engine& engine, comm::Communicator& agreement, std::string dir, nlohmann::json run)
    : engine_(engine), agreement_(agreement), dir_(std::move(dir)), run_(std::move(run)), step_(engine.steps_done()) {
  prepare_step_dir(agreement_, dir_, engine_.plan().groups.size(0));
  ShardedParams& params = engine_.params();
  const bool writes = agreement_.rank() < engine_.plan().groups.size(0);
  std::vector<FlatLayout> layouts;
  std::vector<ShardState> units;
  run_agreed(agreement_, [&] {
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
  if (gather_) return true;
  if (!written_.load(std::memory_order_acquire)) return false;
  if (writer_.joinable()) writer_.join();
  // Written: the host copy is no longer needed, nor is AdamW to be held for it.
  snapshot_.reset();
  in_place_.reset();
  mine_ = file_report(file_, !error_.empty());
  all_.resize(size_t(agreement_.size()));
  gather_ = agreement_.all_gather(mine_.data(), all_.data(), kFileReportFields, DType::i32);
  return true;
}

void AsyncCheckpoint::wait_gathered() {
  if (gathered_) return;
  if (writer_.joinable()) writer_.join();
  written();
  gather_->wait();
  gathered_ = true;
}

int64_t AsyncCheckpoint::commit() {
  ZS_CHECK(gathered_, "AsyncCheckpoint::commit before wait_gathered");
  const auto failed = std::find_if(all_.begin(), all_.end(), report_failed);
  if (failed != all_.end()) {
    std::error_code ignored;  // the failure being reported matters more than a leftover directory
    if (agreement_.rank() == 0) std::filesystem::remove_all(dir_, ignored);
    if (!error_.empty()) throw AgreedFailure(error_, 1, failed - all_.begin() == agreement_.rank());
    throw AgreedFailure("another rank failed", 1, false);
  }
  return commit_step_dir(engine_, agreement_, dir_, step_, all_, std::move(run_));
}

}  // namespace zshard
