#include "runtime/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <ostream>

#include <nlohmann/json.hpp>

#include "comm/agreed_failure.h"
#include "comm/flight_recorder.h"
#include "comm/launch.h"
#include "kernels/engine_ops.h"
#include "kernels/io/atomic_file.h"
#include "kernels/io/safetensors.h"
#include "models/weights_file.h"
#include "runtime/planning/memory_check.h"
#include "runtime/planning/memory_estimator.h"
#include "runtime/planning/rank_balancer.h"
#include "shard/checkpoint_format.h"

namespace zshard {

namespace {

template <class... Args>
[[noreturn]] void usage(const Args&... args) {
  throw UsageError(detail::concat(args...));
}

// A year: longer is no deadline at all, and far beyond it the deadline's time point would overflow.
constexpr double kMaxCommTimeout = 365.0 * 24 * 3600;

// Written so that NaN fails too (every comparison with NaN is false), and +-inf fails the bounds.
void check_range(const char* flag, double value, double lo, double hi, const char* note = "") {
  if (!(std::isfinite(value) && value >= lo && value <= hi))
    usage(flag, " must be a finite number in [", lo, ", ", hi, "]", note, ", got ", value);
}
void check_at_least(const char* flag, double value, double lo, const char* note = "") {
  if (!(std::isfinite(value) && value >= lo)) usage(flag, " must be a finite number >= ", lo, note, ", got ", value);
}

// Sequences of the global batch per rank: --rank-batches, or an even split with the remainder on the
// first ranks (also where auto starts). The gradient stays the exact global mean whatever the split
// (losses are summed and scaled by 1/global tokens).
std::vector<int> split_batch(const TrainOptions& o, int world_size) {
  if (!o.rank_batches.empty()) return o.rank_batches;
  std::vector<int> b(world_size, o.batch / world_size);
  for (int r = 0; r < o.batch % world_size; ++r) ++b[r];
  return b;
}

// Weight of the newest step in the moving average of a rank's speed: it follows a change of load within
// a few steps, and one noisy step moves it by less than half.
constexpr double kSpeedSmoothing = 0.4;

// Test hook: ZSHARD_TEST_SLOW_RANK=r:f reports rank r's compute time f times longer than measured, so
// that a test can force a re-split on an idle machine (zshard never slows a rank down).
double test_slowdown(int rank) {
  const char* s = std::getenv("ZSHARD_TEST_SLOW_RANK");
  if (!s || std::atoi(s) != rank) return 1;
  const char* colon = std::strchr(s, ':');
  return colon ? std::atof(colon + 1) : 1;
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) {
    if (!s.empty()) s += ',';
    s += std::to_string(x);
  }
  return s;
}

// The files rank 0 writes when the run ends: writable now, and none of them an input or another output.
// Checkpoints go into --save-dir: never into a checkpoint the run resumes from.
void check_outputs(const TrainOptions& o) {
  std::vector<FlagPath> taken = {{"--init-from", o.init_from},
                                 {"--data", o.data == "default" ? "" : o.data},
                                 {"--eval-data", o.eval_data == "default" ? "" : o.eval_data},
                                 {"--resume", o.resume == "latest" ? "" : o.resume}};
  check_not_input({"--save-dir", o.save_dir}, taken);
  // A file may go inside an existing --save-dir, but one named as the directory would fail after training.
  std::error_code ec;
  const bool save_dir_exists = std::filesystem::is_directory(o.save_dir, ec);
  const auto directory = [&](const std::filesystem::path& p) {  // absolute, normal, no trailing separator
    const std::filesystem::path n =
        std::filesystem::weakly_canonical(std::filesystem::absolute(p, ec), ec).lexically_normal();
    return n.has_filename() ? n : n.parent_path();
  };
  const auto in_new_save_dir = [&](const std::string& path) {
    if (save_dir_exists || o.save_dir.empty()) return false;
    return directory(std::filesystem::path(path).parent_path()) == directory(o.save_dir);
  };
  for (const FlagPath& out : {FlagPath{"--log-json", o.log_json}, FlagPath{"--save", o.save},
                              FlagPath{"--mem-report", o.mem_report}}) {
    if (out.second.empty()) continue;
    // A file straight inside the --save-dir this run creates (parents and all) at set-up, where a
    // directory that cannot be made is refused (Checkpointer), needs no directory yet.
    if (!in_new_save_dir(out.second)) check_output_path(out.first, out.second);
    check_not_input(out, taken);
    if (!save_dir_exists) check_not_input(out, {{"--save-dir", o.save_dir}});
    taken.push_back(out);
  }
}

// Every parameter present with its shape, and nothing from another model, before any rank allocates.
void check_weights_file(const std::string& path, const Model& model) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  std::vector<std::string> expected;
  for (const UnitSpec& unit : model.units()) {
    for (const ParamSpec& p : unit.params) {
      const SafetensorsEntry& e = file.entry(resolve_name(file, p.name));
      if (e.shape != p.shape)
        fail(path, ": tensor ", e.name, " has shape ", shape_str(e.shape), ", the model needs ",
             shape_str(p.shape));
      expected.push_back(p.name);
    }
  }
  const std::vector<std::string> extra = unmatched_tensors(file, expected);
  if (!extra.empty())
    fail(path, ": tensor ", extra.front(), " (and ", extra.size() - 1,
         " more) belongs to no parameter of this model; was it saved from another size?");
}

}  // namespace

std::string_view dtype_flag(DType dtype) { return dtype == DType::f32 ? "fp32" : dtype_name(dtype); }

std::string_view checkpointing_flag(ActivationCheckpointing mode) {
  return mode == ActivationCheckpointing::blocks ? "blocks" : "none";
}

void validate_options(const TrainOptions& o, int world_size) {
  const Device device = o.placement.device;
  for (const auto& [flag, dtype] : {std::pair{"--param-dtype", o.placement.param_dtype},
                                    std::pair{"--reduce-dtype", o.placement.reduce_dtype}}) {
    if (dtype != DType::f32 && dtype != DType::bf16)
      usage(flag, " must be fp32 or bf16, got ", dtype_flag(dtype));
    if (dtype == DType::bf16 && device == Device::cpu)
      usage(flag, " bf16 needs --device cuda (the cpu computes in fp32)");
  }
  if (o.comm == CommBackend::nccl && device == Device::cpu)
    usage("--comm nccl needs --device cuda (NCCL moves GPU buffers; the cpu uses --comm mpi)");
  if (o.placement.reduce_dtype == DType::bf16 && comm_backend(o) == CommBackend::mpi)
    usage("--reduce-dtype bf16 needs --comm nccl (MPI sums fp32, not bf16)");
  if (const std::string why = device_unavailable(device); !why.empty())
    usage("--device ", device_name(device), ": ", why);
  if (o.batch < 1) usage("--batch must be >= 1, got ", o.batch);
  if (o.seq < 1) usage("--seq must be >= 1, got ", o.seq);
  if (o.steps < 0) usage("--steps must be >= 0, got ", o.steps);
  if (o.grad_accum < 1) usage("--grad-accum must be >= 1, got ", o.grad_accum);
  // Every float flag is finite and in range: a NaN or inf hyper-parameter would train on garbage.
  check_range("--lr", o.lr, 0, 1);
  check_range("--min-lr", o.min_lr, 0, o.lr, " (at most --lr)");
  if (o.warmup < 0) usage("--warmup must be >= 0, got ", o.warmup);
  if (o.lr_schedule != "constant" && o.lr_schedule != "cosine")
    usage("--lr-schedule must be constant or cosine, got '", o.lr_schedule, "'");
  if (o.lr_schedule == "constant" && o.min_lr != 0)
    usage("--min-lr is only for --lr-schedule cosine (a constant rate never decays to it)");
  check_at_least("--wd", o.wd, 0);
  // Decoupled decay multiplies each weight by 1 - lr * wd: past 1 it flips the weights' sign.
  if (double(o.lr) * o.wd > 1) usage("--wd ", o.wd, " times --lr ", o.lr, " exceeds 1: the decay would flip weights");
  if (!(o.beta1 >= 0 && o.beta1 < 1)) usage("--beta1 must be in [0, 1), got ", o.beta1);
  if (!(o.beta2 >= 0 && o.beta2 < 1)) usage("--beta2 must be in [0, 1), got ", o.beta2);
  if (!(o.eps > 0 && o.eps <= 1)) usage("--eps must be in (0, 1], got ", o.eps);
  check_at_least("--grad-clip", o.grad_clip, 0, " (0 disables)");
  if (o.log_every < 1) usage("--log-every must be >= 1, got ", o.log_every);
  if (o.eval_every < 0) usage("--eval-every must be >= 0 (0 = never), got ", o.eval_every);
  if (o.eval_batches < 1) usage("--eval-batches must be >= 1, got ", o.eval_batches);
  if (o.eval_every > 0 && o.eval_data.empty()) usage("--eval-every needs --eval-data (what to evaluate on)");
  if (o.eval_every == 0 && (!o.eval_data.empty() || o.eval_batches != TrainOptions{}.eval_batches))
    usage(o.eval_data.empty() ? "--eval-batches" : "--eval-data", " is only for --eval-every N (how often to evaluate)");
  check_range("--comm-timeout", o.comm_timeout_s, 1e-3, kMaxCommTimeout, " seconds");
  if (o.save_every < 0) usage("--save-every must be >= 0 (0 = only the final save), got ", o.save_every);
  if (o.keep < 0) usage("--keep must be >= 0 (0 keeps every checkpoint), got ", o.keep);
  if (o.save_dir.empty() && (o.save_every > 0 || o.keep > 0))
    usage("--save-every and --keep need --save-dir");
  if (o.resume == "latest" && o.save_dir.empty()) usage("--resume latest needs --save-dir (where to look)");
  if (!o.resume.empty() && !o.init_from.empty())
    usage("--resume and --init-from exclude each other (the checkpoint holds the weights)");
  if (o.strategy.max_inflight < 1) usage("--max-inflight must be >= 1, got ", o.strategy.max_inflight);
  // The other strategies keep whole parameters: there is nothing to gather, and these would do nothing.
  if (!params_sharded(o.strategy.kind)) {
    const StrategyOptions defaults;
    if (o.strategy.max_inflight != defaults.max_inflight) usage("--max-inflight is only for --strategy zero3 or hybrid");
    if (o.strategy.reshard_after_forward != defaults.reshard_after_forward)
      usage("--reshard-after-forward is only for --strategy zero3 or hybrid");
  }
  if (o.strategy.kind != StrategyKind::hybrid && (o.strategy.shard_group != 0 || !o.strategy.shard_group_sizes.empty()))
    usage("--shard-group is only for --strategy hybrid");
  shard_groups(o.strategy, world_size);  // throws for groups that do not fit the world
  if (!o.mem_budget.empty()) {
    if (!o.auto_batch) usage("--mem-budget is the budget of --batch auto (give --batch auto, or drop it)");
    parse_bytes(o.mem_budget, "--mem-budget");
  }
  if (o.auto_batch && !o.rank_batches.empty())
    usage("--batch auto and --rank-batches exclude each other (give --batch N with --rank-batches)");
  if (o.auto_batch && !o.resume.empty())
    usage("--batch auto and --resume exclude each other (resume with the --batch the run chose)");
  if (o.rebalance_every) {
    if (*o.rebalance_every < 0) usage("--rebalance-every must be >= 0 (0 = never), got ", *o.rebalance_every);
    if (!o.rank_batches_auto) usage("--rebalance-every is only for --rank-batches auto");
  }
  if (o.max_rank_batch) {
    if (*o.max_rank_batch < 1) usage("--max-rank-batch must be >= 1, got ", *o.max_rank_batch);
    if (!o.rank_batches_auto) usage("--max-rank-batch is only for --rank-batches auto");
    if (int64_t(*o.max_rank_batch) * world_size < o.batch)
      usage("--max-rank-batch ", *o.max_rank_batch, " on ", world_size, " ranks holds fewer than --batch ", o.batch,
            " sequences");
  }
  if (o.auto_batch && o.rank_batches_auto)
    usage("--batch auto and --rank-batches auto exclude each other (fix --batch N to balance it across ranks)");
  if (o.rank_batches_auto && !o.rank_batches.empty())
    usage("--rank-batches auto takes no sizes beside it, got auto and ", join(o.rank_batches));
  if (!o.rank_batches.empty()) {
    if (int(o.rank_batches.size()) != world_size)
      usage("--rank-batches has ", o.rank_batches.size(), " entries but the world has ", world_size,
            " ranks (one entry per rank)");
    int64_t sum = 0;
    for (int b : o.rank_batches) {
      if (b < 1) usage("--rank-batches: every rank needs at least one sequence, got ", b);
      sum += b;
    }
    if (sum != o.batch) usage("--rank-batches sums to ", sum, " but --batch is ", o.batch);
  } else if (o.batch < world_size) {
    usage("--batch ", o.batch, " is smaller than the world size ", world_size,
          ": every rank needs at least one sequence");
  }
}

CommBackend comm_backend(const TrainOptions& o) {
  return o.comm.value_or(o.placement.device == Device::cuda ? CommBackend::nccl : CommBackend::mpi);
}

ModelConfig resolve_model_config(const TrainOptions& o) { return model_config(o.model, o.overrides); }

Trainer::Trainer(const TrainOptions& options, comm::Communicator& world) : options_(options), world_(world) {
  run_agreed(world, [&] {
    resolve_node_groups(options_.strategy, world);  // collective: first, before anything may throw
    validate_options(options_, world.size());
    config_ = resolve_model_config(options_);
    model_ = build_model(options_.model, config_);
    // Before the memory check, which sizes activations for the mode set.
    model_->set_activation_checkpointing(options_.activation_checkpointing);
    if (options_.seq > model_->context_length())
      usage("--seq ", options_.seq, " exceeds the model's context of ", model_->context_length(), " tokens");
    if (num_params(*model_) < world.size())
      usage("the model has ", num_params(*model_), " parameters, fewer than the ", world.size(),
            " ranks that would shard it");
    const auto load = [&](const std::string& spec, std::string_view flag) {
      TokenDataset d = TokenDataset::load(spec, flag);
      d.check_vocab(model_->vocab_size());
      d.check_seq_len(options_.seq);
      return d;
    };
    data_ = load(options_.data, "--data");
    if (!options_.eval_data.empty()) eval_data_ = load(options_.eval_data, "--eval-data");
    if (!options_.init_from.empty()) check_weights_file(options_.init_from, *model_);
    if (world.rank() == 0) check_outputs(options_);
    if (!options_.trace_dir.empty()) comm::check_trace_dir(options_.trace_dir);
  });
  // The batch buffers are allocated once the memory check has passed: a --batch far too large is refused.
  const std::vector<int> split = split_batch(options_, world.size());
  schedule_ = {options_.lr, options_.min_lr, options_.warmup, std::max(options_.steps, 1),
               options_.lr_schedule == "cosine"};
  world.set_timeout(std::chrono::duration_cast<comm::Clock::duration>(
      std::chrono::duration<double>(options_.comm_timeout_s)));
  // Every rank has a usable device (validate_options); selecting it can still fail locally.
  if (options_.placement.device != Device::cpu)
    run_agreed(world, [&] { select_device(options_.placement.device, world); });
  MemoryBudget budget;  // unknown with --mem-check off: nothing is checked or limited
  if (options_.mem_check)
    run_agreed(world, [&] {
      budget = usable_memory(options_.placement.device, comm::ranks_on_this_host());
      check_memory_fits(options_, *model_, world.size(), split[size_t(world.rank())],
                        *std::max_element(split.begin(), split.end()), budget);
      check_host_memory_fits(options_, *model_, world.size(), usable_memory(Device::cpu, comm::ranks_on_this_host()));
    });
  set_rank_batches(split);
  if (options_.rank_batches_auto) {
    // Each rank's own limit, gathered so that every rank splits within the same caps.
    int32_t cap = options_.max_rank_batch.value_or(options_.batch);
    const int fits = largest_rank_batch_fitting(options_, *model_, world.size(), budget);
    if (fits >= 0) cap = std::min(cap, std::max(fits, rank_batch_));
    rank_batch_caps_.resize(world.size());
    world.all_gather(&cap, rank_batch_caps_.data(), 1, DType::i32)->wait();
  }
  if (!options_.trace_dir.empty() || options_.check_collectives) comm::start_recording(world, options_.trace_dir);
  device_comm_ = open_device_comm(comm_backend(options_), world);
  params_ = std::make_unique<ShardedParams>(*model_, collective_world(), options_.strategy,
                                            options_.seed, options_.placement);
  if (options_.check_collectives) collective_check_ = std::make_unique<comm::CollectiveCheck>(world);
  if (!options_.init_from.empty()) run_agreed(world, [&] { load_weights(options_.init_from); });
}

Trainer::~Trainer() {
  // Device memory first, in the order the members would go, so that the allocator's pool can give it
  // back for whatever runs next in this process (zshard-bench runs one Trainer per strategy).
  params_.reset();
  device_comm_.reset();
  model_.reset();
  release_cached_memory(options_.placement.device);
}

void Trainer::set_rank_batches(const std::vector<int>& batches) {
  rank_batches_ = batches;
  rank_batch_ = batches[world_.rank()];
  rank_offset_ = 0;
  for (int r = 0; r < world_.rank(); ++r) rank_offset_ += batches[r];
  inputs_.resize(size_t(rank_batch_) * options_.seq);
  targets_.resize(inputs_.size());
}

std::vector<double> Trainer::gathered_seq_per_s() {
  const double mine = seconds_per_seq_ > 0 ? 1 / seconds_per_seq_ : 0;
  std::vector<double> all(world_.size());
  world_.all_gather(&mine, all.data(), 1, DType::f64)->wait();
  return all;
}

void Trainer::measure_speed(double batch_ms, double waited_ms) {
  // Where the waits cannot be seen (NaN), all of it. The bound keeps the compute time positive should the
  // two clocks disagree.
  waited_ms = std::isfinite(waited_ms) ? std::clamp(waited_ms, 0.0, 0.95 * batch_ms) : 0;
  const double per_seq =
      (batch_ms - waited_ms) / 1e3 / (double(rank_batch_) * options_.grad_accum) * test_slowdown(world_.rank());
  seconds_per_seq_ = seconds_per_seq_ > 0 ? kSpeedSmoothing * per_seq + (1 - kSpeedSmoothing) * seconds_per_seq_
                                          : per_seq;
}

std::vector<double> Trainer::maybe_rebalance() {
  const int every = options_.rebalance_interval();
  if (!options_.rank_batches_auto || every == 0 || steps_done_ % every != 0 || world_.size() == 1) return {};
  const std::vector<double> seq_per_s = gathered_seq_per_s();
  const std::vector<int> split = rebalanced_split(rank_batches_, seq_per_s, rank_batch_caps_);
  if (split == rank_batches_) return {};
  set_rank_batches(split);
  return seq_per_s;
}

void Trainer::load_weights(const std::string& path) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  for (int u = 0; u < params_->num_units(); ++u) {
    const FlatLayout& layout = params_->layout(u);
    std::vector<float> full(layout.padded_numel(), 0.0f);
    for (size_t i = 0; i < layout.spec().params.size(); ++i) {
      const ParamSpec& p = layout.spec().params[i];
      file.read_f32(resolve_name(file, p.name), full.data() + layout.offset(int(i)), p.shape);
    }
    params_->set_unit_params(u, full.data());
  }
}

void Trainer::save_weights(const std::string& path) {
  std::vector<std::vector<float>> units;
  for (int u = 0; u < params_->num_units(); ++u) units.push_back(params_->full_unit_params(u));
  run_agreed(world_, [&] {
    if (world_.rank() == 0) save_consolidated(path, model_->units(), units);
  });
}

// Test hooks, so that tests can check how a run ends. ZSHARD_FAULT_STEP=s with ZSHARD_FAULT_RANK=r: rank r
// throws in step s (one failing rank must end the whole job, not leave its peers in a collective). With
// ZSHARD_FAULT_KIND=nan instead: a parameter turns NaN on every rank before step s, as in a divergence.
void Trainer::maybe_inject_fault(int step) {
  const char* s = std::getenv("ZSHARD_FAULT_STEP");
  if (!s || std::atoi(s) != step) return;
  if (const char* kind = std::getenv("ZSHARD_FAULT_KIND"); kind && std::string_view(kind) == "nan") {
    std::vector<float> unit = params_->full_unit_params(0);
    unit[0] = std::numeric_limits<float>::quiet_NaN();
    params_->set_unit_params(0, unit.data());
    return;
  }
  if (const char* r = std::getenv("ZSHARD_FAULT_RANK"); r && std::atoi(r) == world_.rank())
    fail("injected fault (ZSHARD_FAULT_RANK=", r, ", ZSHARD_FAULT_STEP=", s, ")");
}

StepResult Trainer::step() {
  const auto t0 = std::chrono::steady_clock::now();
  const int K = options_.grad_accum, B = options_.batch, T = options_.seq;
  const double global_tokens = double(B) * T * K;
  const comm::CommStats before = params_->comm_stats();
  maybe_inject_fault(steps_done_ + 1);

  double loss_sum = 0;
  for (int m = 0; m < K; ++m) {
    params_->begin_micro_step(/*sync_grads=*/m == K - 1);
    const int64_t micro_step = int64_t(steps_done_) * K + m;
    data_.fill_batch(micro_step, B, T, rank_offset_, rank_batch_, inputs_.data(), targets_.data());
    const Batch batch{inputs_.data(), targets_.data(), rank_batch_, T};
    loss_sum += model_->forward_backward(*params_, batch, float(1.0 / global_tokens));
    params_->end_micro_step();
  }

  StepResult r;
  r.step = steps_done_ + 1;
  r.grad_norm = params_->grad_norm();
  // The part of the step that the split changes ends here (the norm is on the host, so the device is
  // done): the optimizer's cost does not depend on the batch and would make a rank with few sequences
  // look slow per sequence.
  const double batch_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const double batch_waited_ms = (params_->comm_stats().seconds_waiting - before.seconds_waiting) * 1e3;
  comm::all_reduce_sum(world_, &loss_sum, 1);
  r.loss = loss_sum / global_tokens;
  // Both are all-reduced, so every rank stops here alike, before AdamW would spread the damage into the
  // weights and the optimizer state (and from there into a checkpoint).
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm))
    throw AgreedFailure(detail::concat("step ", r.step, ": non-finite ", std::isfinite(r.loss) ? "gradient norm" : "loss",
                                       " (loss ", r.loss, ", gradient norm ", r.grad_norm,
                                       "); stopped before the optimizer step; nothing of this step is saved"),
                        1, world_.rank() == 0);
  // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1.
  float clip_scale = 1.0f;
  if (options_.grad_clip > 0) {
    const double coef = options_.grad_clip / (r.grad_norm + 1e-6);
    if (coef < 1.0) clip_scale = float(coef);
  }
  r.lr = schedule_.at(steps_done_);
  ops::AdamWParams hp{r.lr, options_.beta1, options_.beta2, options_.eps, options_.wd, r.step, clip_scale};
  params_->optimizer_step(hp);
  ops::synchronize(options_.placement.device);  // the step's device work is queued, not yet done
  if (collective_check_) collective_check_->compare(r.step);

  const comm::CommStats after = params_->comm_stats();
  r.comm_bytes = after.total_bytes() - before.total_bytes();
  // Exposed communication: the host blocked in Work::wait() (mpi), or the compute stream stalled on a
  // collective, timed on the GPU (nccl; complete here since the device was synchronised above).
  r.comm_exposed_ms = (after.seconds_waiting - before.seconds_waiting) * 1e3;
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  r.tokens_per_s = global_tokens / (r.ms / 1e3);
  r.rank_batches = rank_batches_;
  ++steps_done_;
  measure_speed(batch_ms, batch_waited_ms);
  r.resplit_seq_per_s = maybe_rebalance();
  if (options_.eval_every > 0 && (r.step % options_.eval_every == 0 || r.step == options_.steps))
    r.eval_loss = evaluate();
  history_.push_back(r);
  return r;
}

double Trainer::evaluate() {
  const int B = options_.batch, T = options_.seq;
  double loss_sum = 0;
  // The same batches every time (the first of the stream), so that evaluations compare.
  for (int k = 0; k < options_.eval_batches; ++k) {
    params_->begin_forward_only();
    eval_data_.fill_batch(k, B, T, rank_offset_, rank_batch_, inputs_.data(), targets_.data());
    loss_sum += model_->forward(*params_, {inputs_.data(), targets_.data(), rank_batch_, T});
    params_->end_micro_step();
  }
  comm::all_reduce_sum(world_, &loss_sum, 1);
  return loss_sum / (double(B) * T * options_.eval_batches);
}

void Trainer::log_step(const StepResult& r, std::ostream* out) {
  if (world_.rank() != 0 || !out) return;
  const bool last = r.step == options_.steps;
  if (r.step == 1 || r.step % options_.log_every == 0 || last) {
    const double eta = train_seconds_ / double(history_.size()) * (options_.steps - r.step);
    *out << "step " << std::setw(5) << r.step << "/" << options_.steps << "  loss " << std::fixed
         << std::setprecision(4) << r.loss << "  norm " << std::setprecision(3) << r.grad_norm << "  lr "
         << std::scientific << std::setprecision(2) << r.lr << std::fixed << "  "
         << std::setprecision(0) << r.tokens_per_s << " tok/s  " << std::setprecision(1) << r.ms
         << " ms  ETA " << std::setprecision(0) << eta << " s\n"
         << std::flush;
  }
  if (!r.resplit_seq_per_s.empty()) {
    *out << "step " << r.step << ": rank batches " << join(rank_batches_) << " (measured seq/s" << std::fixed
         << std::setprecision(1);
    for (size_t i = 0; i < r.resplit_seq_per_s.size(); ++i) *out << (i ? "," : " ") << r.resplit_seq_per_s[i];
    *out << ")\n" << std::flush;
  }
  if (!std::isnan(r.eval_loss))
    *out << "step " << r.step << ": eval loss " << std::fixed << std::setprecision(4) << r.eval_loss << "\n"
         << std::flush;
}

void Trainer::write_log_json() {
  if (options_.log_json.empty()) return;
  run_agreed(world_, [&] {
    if (world_.rank() != 0) return;
    std::string text;
    for (const StepResult& r : history_) {
      nlohmann::json j = {{"step", r.step},           {"loss", r.loss},
                          {"lr", r.lr},               {"grad_norm", r.grad_norm},
                          {"ms", r.ms},               {"tokens_per_s", r.tokens_per_s},
                          {"comm_bytes", r.comm_bytes}, {"comm_exposed_ms", r.comm_exposed_ms},
                          {"rank_batches", r.rank_batches}};
      if (!std::isnan(r.eval_loss)) j["eval_loss"] = r.eval_loss;
      text += j.dump() + "\n";
    }
    write_file_atomically(options_.log_json, text);
  });
}

StepResult Trainer::run_step(std::ostream* out) {
  StepResult r;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    r = step();
  } catch (const AgreedFailure&) {
    // The steps that went well; a log that cannot be written (its --save-dir not made yet under
    // --batch auto) must not hide why the step failed.
    try {
      write_log_json();
    } catch (const AgreedFailure&) {
    }
    throw;
  }
  // The ETA's time: the step with its evaluation and re-split.
  train_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log_step(r, out);
  return r;
}

void Trainer::run(std::ostream* out, const std::function<bool()>& after_step) {
  while (steps_done_ < options_.steps) {
    run_step(out);
    if (after_step && !after_step()) break;
  }
  write_log_json();
  if (out && world_.rank() == 0 && !history_.empty()) {
    double tok_s = 0;
    for (const auto& h : history_) tok_s += h.tokens_per_s;
    *out << "done: " << history_.size() << " steps, loss " << std::fixed << std::setprecision(4)
         << history_.front().loss << " -> " << history_.back().loss << ", mean "
         << std::setprecision(0) << tok_s / history_.size() << " tok/s, " << std::setprecision(1)
         << train_seconds_ << " s\n";
  }
}

}  // namespace zshard
