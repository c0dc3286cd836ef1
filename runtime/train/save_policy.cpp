#include "runtime/train/save_policy.h"

#include <array>
#include <csignal>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <thread>

#include "comm/agreed_failure.h"
#include "comm/launch.h"
#include "kernels/device_memory.h"
#include "kernels/io/atomic_file.h"
#include "shard/checkpoint_format.h"

namespace zshard {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

// mpirun also ends the ranks of a failed job with SIGTERM: the flight recorder dumps first (with
// --trace-dir), and a rank that fails after it exits at once (comm/launch.h).
void on_stop_signal(int sig) {
  comm::note_termination_signal(sig);
  g_stop_signal = sig;
}

template <class... Args>
[[noreturn]] void usage(const Args&... args) {
  throw UsageError(detail::concat(args...));
}

// Test hook: ZSHARD_TEST_PAUSE_IN_SAVE=seconds holds rank 0 between the rank files and the manifest,
// so a test can kill the job in the middle of a save.
void maybe_pause_in_save() {
  if (const char* s = std::getenv("ZSHARD_TEST_PAUSE_IN_SAVE"))
    std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(s)));
}

std::string manifest_path(const std::string& dir) { return (fs::path(dir) / kManifestFile).string(); }

// What a checkpoint records of its model: the registry name and the configuration.
json model_json(const std::string& name, const ModelConfig& config) { return {{"name", name}, {"config", config}}; }

// A manifest's model; checkpoints written before the name moved into it kept it in "model_name".
json saved_model(const json& run) {
  const json& m = run.at("model");
  return m.contains("name") ? m : model_json(run.at("model_name").get<std::string>(), m.get<ModelConfig>());
}

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

// A unit's owned fp32 shards in the order of kShardKinds: master params, Adam m, Adam v.
std::array<Tensor, 3> owned_state(const ShardedParams& params, int unit) {
  return {params.owned_params(unit), params.adam_m(unit), params.adam_v(unit)};
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

void remove_dir(const std::string& dir) {
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (ec) fail(dir, ": cannot remove (", ec.message(), ")");
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  // SA_RESETHAND: a second signal of the same kind takes the default action and ends the process.
  sa.sa_flags = SA_RESTART | SA_RESETHAND;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

Checkpointer::Checkpointer(Trainer& trainer, std::ostream* out)
    : trainer_(trainer), world_(trainer.world()), out_(world_.rank() == 0 ? out : nullptr) {
  const TrainOptions& o = trainer.options();
  std::string dir;
  Manifest manifest;
  std::vector<std::string> report;
  run_agreed(world_, [&] {
    if (!o.resume.empty()) {
      dir = o.resume;
      if (dir == "latest") {
        dir.clear();
        for (const CheckpointEntry& e : list_checkpoints(o.save_dir)) if (e.committed) dir = e.path;
        if (dir.empty()) usage("--resume latest: no committed checkpoint in --save-dir ", o.save_dir);
      }
      manifest = read_manifest(dir);
      report = compare_with_flags(dir, manifest);
      check_units(dir, manifest, trainer.model().units());
      // Every rank checks that the files are there; rank r checksums files r, r + N, ... so each file
      // is read once.
      for (size_t s = 0; s < manifest.files.size(); ++s)
        verify_file(dir, manifest.files[s], int(s) % world_.size() == world_.rank());
    }
    check_save_dir(dir, manifest.step);
  });
  if (dir.empty()) return;

  ShardedParams& params = trainer.params();
  run_agreed(world_, [&] {
    CheckpointReader reader(dir, manifest);
    for (int u = 0; u < params.num_units(); ++u) {
      const FlatLayout& layout = params.layout(u);
      const int64_t begin = layout.shard_begin(params.shard_index()), n = layout.shard_numel();
      const std::array<Tensor, 3> state = owned_state(params, u);
      for (size_t k = 0; k < state.size(); ++k) {
        HostShard shard(state[k]);
        reader.read(u, kShardKinds[k], begin, n, shard.data());
        shard.put_back();
      }
    }
  });
  params.sync_resident_params();
  trainer.restore_steps_done(manifest.step);
  if (o.rank_batches_auto) continue_split(manifest.run);
  resumed_step_ = manifest.step;
  std::error_code ec;
  if (!o.save_dir.empty() && fs::equivalent(dir, fs::path(o.save_dir) / step_dir_name(manifest.step), ec))
    saved_step_ = manifest.step;
  if (out_) for (const std::string& line : report) *out_ << "zshard-train: " << line << "\n";
}

json Checkpointer::run_state(int step, const std::vector<int>& rank_batches) const {
  const TrainOptions& o = trainer_.options();
  return {
      {"model", model_json(o.model, trainer_.config())},
      {"strategy", {{"kind", strategy_name(o.strategy.kind)},
                    {"shard_group", trainer_.params().groups().describe()},
                    {"world_size", world_.size()}}},
      {"rank_batches", rank_batches},
      // Flags that decide what the next steps compute, by flag name: resuming with other values works
      // but no longer repeats the uninterrupted run, so the resume notes them.
      {"flags", {{"data", o.data}, {"batch", o.batch}, {"seq", o.seq}, {"grad-accum", o.grad_accum},
                 {"steps", o.steps}, {"lr", o.lr}, {"warmup", o.warmup}, {"lr-schedule", o.lr_schedule},
                 {"min-lr", o.min_lr}, {"wd", o.wd}, {"beta1", o.beta1}, {"beta2", o.beta2},
                 {"eps", o.eps}, {"grad-clip", o.grad_clip}, {"seed", o.seed},
                 {"device", device_name(o.placement.device)},
                 {"param-dtype", dtype_flag(o.placement.param_dtype)},
                 {"reduce-dtype", dtype_flag(o.placement.reduce_dtype)}}},
      // Positions, all determined by the step count.
      {"lr_schedule_position", step},
      {"adam_step", step},
      {"data_position",
       {{"micro_steps", int64_t(step) * o.grad_accum}, {"sequences_per_micro_step", o.batch}}},
      {"rng", {{"seed", o.seed}, {"draws_after_init", 0}}},
  };
}

std::vector<std::string> Checkpointer::compare_with_flags(const std::string& dir, const Manifest& m) const {
  const json want = model_json(trainer_.options().model, trainer_.config());
  const json now = run_state(m.step, {});
  try {
    const json& saved = m.run;
    if (saved_model(saved) != want)
      usage(manifest_path(dir), ": the checkpoint holds model ", describe_model(saved_model(saved)),
            ", the flags ask for ", describe_model(want));
    const json& s = saved.at("strategy");
    std::vector<std::string> lines = {detail::concat(
        "resumed from ", dir, " at step ", m.step, " (saved by ", s.at("kind").get<std::string>(), " on ",
        s.at("world_size").get<int>(), " rank(s))")};
    for (const auto& [flag, value] : saved.at("flags").items())
      if (now.at("flags").value(flag, json()) != value)
        lines.push_back(detail::concat("note: --", flag, " was ", flag_text(value),
                                       " when saved; the run will not repeat the uninterrupted one"));
    return lines;
  } catch (const json::exception& e) {
    fail(manifest_path(dir), ": not a valid zshard manifest (", e.what(), ")");
  }
}

void Checkpointer::check_save_dir(const std::string& resume_dir, int resumed_step) {
  const std::string& save_dir = trainer_.options().save_dir;
  if (save_dir.empty()) return;
  // Saving never overwrites a checkpoint: the save directory may hold only what led to this run.
  for (const CheckpointEntry& e : list_checkpoints(save_dir)) {
    if (!e.committed) continue;  // an interrupted save: not a checkpoint, overwritten when reached
    std::error_code ec;
    if (resume_dir.empty())
      usage("--save-dir ", save_dir, " already holds checkpoints (", e.path,
            "); continue them with --resume latest, or choose another directory");
    if (e.step > resumed_step || (e.step == resumed_step && !fs::equivalent(e.path, resume_dir, ec)))
      usage("--save-dir ", save_dir, " holds ", e.path, ", which a save of this run would overwrite; ",
            "choose another directory");
  }
  std::error_code ec;
  if (world_.rank() != 0) return;
  created_save_dir_ = fs::create_directories(save_dir, ec);
  if (ec) usage("--save-dir ", save_dir, ": cannot create (", ec.message(), ")");
}

void Checkpointer::continue_split(const json& run) {
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
  if (sum == trainer_.options().batch) trainer_.set_rank_batches(saved);
}

bool Checkpointer::after_step() {
  const TrainOptions& o = trainer_.options();
  if (o.save_every > 0 && trainer_.steps_done() % o.save_every == 0) save();
  double signalled = g_stop_signal != 0 ? 1.0 : 0.0;
  comm::all_reduce_sum(world_, &signalled, 1);
  if (signalled == 0) return true;
  if (out_)
    *out_ << "zshard-train: stop signal received; stopping after step " << trainer_.steps_done()
          << (o.save_dir.empty() ? " (no --save-dir: nothing saved)" : "") << "\n";
  return false;
}

void Checkpointer::save() {
  const TrainOptions& o = trainer_.options();
  const int step = trainer_.steps_done();
  if (o.save_dir.empty() || step == saved_step_) return;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string dir = (fs::path(o.save_dir) / step_dir_name(step)).string();
  ShardedParams& params = trainer_.params();

  // The first shard group writes: world ranks 0..G-1, whose shard index is their rank.
  run_agreed(world_, [&] {
    if (world_.rank() != 0) return;
    remove_dir(dir);  // what an interrupted save of this step left
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) fail(dir, ": cannot create (", ec.message(), ")");
  });
  CheckpointFile file;
  // A rank file that cannot be written (a full disk, a NaN in the state) takes the step's directory with
  // it, so the newest checkpoint stays the last good one.
  try {
    run_agreed(world_, [&] {
      if (world_.rank() >= params.groups().size(0)) return;
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
    if (world_.rank() == 0) {
      fs::remove_all(dir, ignored);
      if (created_save_dir_ && fs::is_empty(o.save_dir, ignored)) fs::remove(o.save_dir, ignored);
    }
    throw;
  }
  // The gather doubles as the barrier: every rank file is in place before the manifest is written.
  constexpr int kFields = 5;
  const int32_t mine[kFields] = {int32_t(file.checksum), int32_t(file.checksum >> 32), int32_t(file.bytes),
                                 int32_t(file.bytes >> 32), trainer_.rank_batch()};
  std::vector<int32_t> all(size_t(kFields) * world_.size());
  world_.all_gather(mine, all.data(), kFields, DType::i32)->wait();
  const auto u64 = [](int32_t lo, int32_t hi) {
    return uint64_t(uint32_t(lo)) | uint64_t(uint32_t(hi)) << 32;
  };

  uint64_t total_bytes = 0;
  run_agreed(world_, [&] {
    if (world_.rank() != 0) return;
    Manifest m;
    m.step = step;
    m.group_size = params.groups().size(0);
    m.pad_multiple = params.groups().pad_multiple();
    m.units = trainer_.model().units();
    std::vector<int> rank_batches;
    for (int r = 0; r < world_.size(); ++r) {
      const int32_t* f = &all[size_t(r) * kFields];
      rank_batches.push_back(f[4]);
      if (r < m.group_size) m.files.push_back({rank_file_name(r), u64(f[2], f[3]), u64(f[0], f[1])});
      if (r < m.group_size) total_bytes += m.files.back().bytes;
    }
    m.run = run_state(step, rank_batches);
    maybe_pause_in_save();
    sync_dir(dir);
    commit_manifest(dir, m);
    prune(step);
  });
  saved_step_ = step;
  if (out_)
    *out_ << "zshard-train: checkpoint " << dir << " saved (" << std::fixed << std::setprecision(1)
          << double(total_bytes) / (1 << 20) << " MiB, "
          << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s)\n";
}

void Checkpointer::prune(int newest_step) const {
  const int keep = trainer_.options().keep;
  const std::vector<CheckpointEntry> entries = list_checkpoints(trainer_.options().save_dir);
  int kept = 0;
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    if (it->step >= newest_step) {
      kept += it->committed;
    } else if (!it->committed) {
      remove_dir(it->path);  // an interrupted save, older than a committed checkpoint
    } else if (keep > 0 && ++kept > keep) {
      // Uncommit first: a crash in the middle leaves a directory that is not a checkpoint.
      std::error_code ec;
      fs::remove(manifest_path(it->path), ec);
      sync_dir(it->path);
      remove_dir(it->path);
    }
  }
}

}  // namespace zshard
