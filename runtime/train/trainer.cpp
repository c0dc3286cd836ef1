#include "runtime/train/trainer.h"

#include <algorithm>
#include <cerrno>  // program_invocation_short_name
#include <chrono>
#include <cmath>
#include <limits>
#include <iomanip>
#include <iostream>
#include <ostream>
#include <utility>

#include <nlohmann/json.hpp>

#include "comm/agreed_failure.h"
#include "comm/flight_recorder/recorder.h"
#include "comm/launch.h"
#include "kernels/device_timer.h"
#include "kernels/io/atomic_file.h"
#include "kernels/test_hooks.h"
#include "shard/memory/fit_check.h"
#include "shard/memory/estimator.h"
#include "runtime/planning/rank_balancer.h"
#include "runtime/train/step_log.h"
#include "runtime/train/weights_export.h"
#include "shard/engine_internals.h"
#include "shard/frozen_params.h"
#include "shard/plan_internals.h"
#include "shard/step_graph.h"
#include "shard/unit_specs.h"

namespace zshard {

namespace {

// Weight of the newest step in the moving average of a rank's speed: it follows a change of load within
// a few steps, and one noisy step moves it by less than half.
constexpr double kSpeedSmoothing = 0.4;

// How many times longer than measured `rank` reports its compute time: 1 but under ZSHARD_TEST_SLOW_RANK.
double test_slowdown(int rank) {
  const std::optional<TestHooks::SlowRank>& slow = test_hooks().slow_rank;
  return slow && slow->rank == rank ? slow->factor : 1;
}

// --attention auto resolves on each rank from what that rank can load (cuDNN): ranks that differ would
// size and compute attention differently, so fused runs only where every rank took it.
void agree_on_attention(comm::Communicator& world, Model& model, AttentionKernel taken) {
  double fused = taken == AttentionKernel::fused ? 1 : 0;
  comm::all_reduce_sum(world, &fused, 1);
  if (taken != AttentionKernel::fused || int(fused) == world.size()) return;
  model.set_attention(AttentionKernel::blocks);
  if (world.rank() == 0)
    std::cerr << "zshard: --attention auto: blocks on every rank: " << world.size() - int(fused)
              << " rank(s) cannot run fused\n";
}

}  // namespace

void check_run_inputs(const TrainOptions& options, const Model& model) {
  const int seq = options.data.seq;
  if (seq > model.context_length()) refuse("--seq ", seq, " exceeds the model's context of ", model.context_length(), " tokens");
  // A checkpoint holds the trained parameters only: frozen ones (a LoRA run's base, a model's own
  // ParamSpec::frozen) come from --init-from again, which the checkpoint's fingerprint of them checks.
  if (!options.saves.resume.empty() && !options.model.init_from.empty() &&
      count_params(model, options.model.freeze).frozen == 0)
    refuse("--resume and --init-from exclude each other (the checkpoint holds the weights); with frozen "
           "parameters (--freeze, --lora-rank, the model's own) --init-from gives them");
  TokenDataset::check_source(options.data.source, "--data");
  if (!options.eval.source.empty()) TokenDataset::check_source(options.eval.source, "--eval-data");
  // Before any rank allocates; the engine's import checks again, finding the same.
  check_init_base_and_adapters(options.model.init_from, options.model.init_adapters, model);
}

Trainer::Trainer(const TrainOptions& options, comm::Communicator& world) : options_(options), world_(world) {
  ShardPlan plan;
  AttentionKernel attention = AttentionKernel::blocks;
  const DataOptions& data = options_.data;
  run_agreed(world, [&] {
    plan = resolve_plan(options_.plan, world);  // sets the timeout, then its collectives: the first of the run
    check_groups_carry_quantization(plan);
    validate_options(options_, world.size());
    if (options_.model.cuda_graphs) check_cuda_graphs(plan.placement, world.size());
    config_ = resolve_model_config(options_.model);
    model_ = build_model(options_.model.name, config_);
    // Before the memory check, which sizes activations for what the model keeps.
    attention = configure_model(*model_, options_.model, plan.placement, world.rank() == 0 ? &std::cerr : nullptr);
    // Before counting the units or matching a weights file to them: a negative dimension is the error to name.
    check_unit_specs(model_->units());
    check_run_inputs(options_, *model_);
    if (num_params(*model_) == 0)
      refuse("the model declares no parameters (its units() lists none with elements): nothing to train");
    if (num_params(*model_) < world.size())
      refuse("the model has ", num_params(*model_), " parameters, fewer than the ", world.size(),
             " ranks that would shard it");
    const auto load = [&](const std::string& spec, std::string_view flag) {
      TokenDataset d = TokenDataset::load(spec, flag);
      d.check_vocab(model_->vocab_size());
      d.check_seq_len(data.seq);
      return d;
    };
    data_ = load(data.source, "--data");
    if (!options_.eval.source.empty()) {
      eval_data_ = load(options_.eval.source, "--eval-data");
      // The evaluation's batches are the data's first tokens, each read once: an average over repeats
      // would pass for a held-out loss.
      eval_data_.check_holds(int64_t(options_.eval.batches) * data.batch * data.grad_accum, data.seq,
                             detail::concat("--eval-batches ", options_.eval.batches, " of ", data.batch, "x",
                                            data.seq, data.grad_accum > 1 ? " x grad-accum " + std::to_string(data.grad_accum) : ""));
    }
    if (world.rank() == 0) {
      check_outputs(options_);
      if (!options_.output.save.empty()) check_adapter_config_output("--save", options_.output.save, *model_);
    }
    if (!options_.output.trace_dir.empty()) comm::check_trace_dir(options_.output.trace_dir);
  });
  agree_on_attention(world, *model_, attention);
  // The batch buffers are allocated once the memory check has passed: a --batch far too large is refused.
  const std::vector<int> split = split_batch(data, world.size());
  MemoryBudget budget;  // unknown with --mem-check off: nothing is checked or limited
  if (data.mem_check)
    run_agreed(world, [&] {
      budget = usable_memory(plan.placement.device, comm::ranks_on_this_host());
      check_memory_fits(plan, *model_, batch_shape(options_), split[size_t(world.rank())],
                        *std::max_element(split.begin(), split.end()), budget);
      check_host_memory_fits(plan, *model_, batch_shape(options_), usable_memory(Device::cpu, comm::ranks_on_this_host()));
    });
  set_rank_batches(split);
  if (data.rank_batches_auto) {
    // Each rank's own limit, gathered so that every rank splits within the same caps.
    int32_t cap = data.max_rank_batch.value_or(data.batch);
    const int fits = largest_rank_batch_fitting(plan, *model_, batch_shape(options_), budget);
    if (fits >= 0) cap = std::min(cap, std::max(fits, rank_batch_));
    rank_batch_caps_.resize(world.size());
    world.all_gather(&cap, rank_batch_caps_.data(), 1, DType::i32)->wait();
  }
  if (!options_.output.trace_dir.empty() || options_.output.check_collectives)
    comm::start_recording(world, options_.output.trace_dir);
  const int64_t tokens_per_step = int64_t(data.batch) * data.seq * data.grad_accum;
  engine_ = std::make_unique<Engine>(*model_, world, plan,
                                     EngineOptions{options_.model.seed, data.grad_accum, tokens_per_step,
                                                   options_.model.freeze, options_.model.cuda_graphs});
  // A replayed step's micro-steps run inside step(), the optimizer with them, where no event can mark
  // them: the host's clock times the whole step instead (what it measures splits the batch among ranks,
  // and a graph runs on one).
  batch_timer_ = std::make_unique<DeviceTimer>(options_.model.cuda_graphs ? Device::cpu : plan.placement.device);
  if (options_.output.check_collectives) collective_check_ = std::make_unique<comm::CollectiveCheck>(world);
  if (!options_.model.init_from.empty()) engine_->import_weights(options_.model.init_from);
  if (!options_.model.init_adapters.empty()) engine_->import_weights(options_.model.init_adapters);
  // Positions wrap at the data's end (epochs): within one step a token read twice weighs double. Said once
  // a process's run starts (zshard-bench and --batch auto build a trainer per try), not refused: a
  // benchmark's large batch on the embedded corpus (31,794 tokens) does it on purpose.
  static bool warned = false;
  if (const int64_t step = tokens_per_step + 1; data_.size() < step && world.rank() == 0 && !std::exchange(warned, true))
    std::cerr << program_invocation_short_name << ": warning: --data " << data_.source() << " holds " << data_.size()
              << " tokens, fewer than the " << step << " of one step: each step reads some twice\n";
}

Trainer::~Trainer() {
  // The engine's device memory before the model's.
  batch_timer_.reset();
  engine_.reset();
  model_.reset();
}

void Trainer::set_rank_batches(const std::vector<int>& batches) {
  rank_batches_ = batches;
  rank_batch_ = batches[world_.rank()];
  rank_offset_ = 0;
  for (int r = 0; r < world_.rank(); ++r) rank_offset_ += batches[r];
  inputs_.resize(size_t(rank_batch_) * options_.data.seq);
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
      (batch_ms - waited_ms) / 1e3 / (double(rank_batch_) * options_.data.grad_accum) * test_slowdown(world_.rank());
  seconds_per_seq_ = seconds_per_seq_ > 0 ? kSpeedSmoothing * per_seq + (1 - kSpeedSmoothing) * seconds_per_seq_
                                          : per_seq;
}

std::vector<double> Trainer::maybe_rebalance() {
  const int every = options_.data.rebalance_interval();
  if (!options_.data.rank_batches_auto || every == 0 || steps_done() % every != 0 || world_.size() == 1) return {};
  const std::vector<double> seq_per_s = gathered_seq_per_s();
  const std::vector<int> split = rebalanced_split(rank_batches_, seq_per_s, rank_batch_caps_);
  if (split == rank_batches_) return {};
  set_rank_batches(split);
  return seq_per_s;
}

// The test hooks that make a run end badly (ZSHARD_TEST_NAN_STEP, ZSHARD_TEST_FAIL_RANK), so that tests can
// check how it ends.
void Trainer::maybe_inject_fault(int step) {
  const TestHooks& hooks = test_hooks();
  if (hooks.nan_step == step) {
    ShardedParams& params = EngineInternals::params(*engine_);
    FlatValues unit = params.full_unit_params(0);
    unit[0] = std::numeric_limits<float>::quiet_NaN();
    params.set_unit_params(0, unit.data());
  }
  if (hooks.fail_rank && hooks.fail_rank->rank == world_.rank() && hooks.fail_rank->step == step)
    fail("injected fault (ZSHARD_TEST_FAIL_RANK=", world_.rank(), ":", step, ")");
}

StepResult Trainer::step() {
  const auto t0 = std::chrono::steady_clock::now();
  const int K = options_.data.grad_accum, B = options_.data.batch, T = options_.data.seq;
  const comm::CommStats before = engine_->comm_stats();
  StepResult r;
  r.step = steps_done() + 1;
  maybe_inject_fault(r.step);

  // The part of the step that the split changes is timed on the device, which the host never waits for
  // here: the optimizer's cost does not depend on the batch and would make a rank with few sequences look
  // slow per sequence. The waits are those the host has seen by the end of the micro-steps (all of them on
  // the mpi backend; nccl's stalls still in flight then count as compute).
  batch_timer_->start();
  for (int m = 0; m < K; ++m) {
    const int64_t micro_step = int64_t(steps_done()) * K + m;
    data_.fill_batch(micro_step, B, T, rank_offset_, rank_batch_, inputs_.data(), targets_.data());
    engine_->forward_backward({inputs_.data(), targets_.data(), rank_batch_, T});
  }
  const bool graphs = options_.model.cuda_graphs;
  if (!graphs) batch_timer_->stop();
  const double batch_waited_ms = (engine_->comm_stats().seconds_waiting - before.seconds_waiting) * 1e3;
  const AdamW hp = options_.optimizer.adamw(steps_done());
  r.lr = hp.lr;
  const StepStats stats = engine_->step(hp);
  if (graphs) batch_timer_->stop();
  r.loss = stats.loss;
  r.grad_norm = stats.grad_norm;
  r.comm_bytes = engine_->last_step_comm_bytes();
  r.comm_exposed_ms = engine_->last_step_comm_exposed_ms();
  if (collective_check_) collective_check_->compare(r.step);
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  r.tokens_per_s = double(stats.tokens) / (r.ms / 1e3);
  r.rank_batches = rank_batches_;
  measure_speed(batch_timer_->elapsed_ms(), batch_waited_ms);  // the step waited for the device
  r.resplit_seq_per_s = maybe_rebalance();
  const EvalOptions& eval = options_.eval;
  if (eval.every > 0 && (r.step % eval.every == 0 || r.step == options_.optimizer.steps)) r.eval_loss = evaluate();
  history_.push_back(r);
  return r;
}

double Trainer::evaluate() {
  const int T = options_.data.seq;
  // The same batches every time (the first of the stream), so that evaluations compare; a batch is a step's
  // sequences, read a micro-batch at a time, so that a step cut into other micro-batches (a resume, a
  // relaunch that must fit in less memory) evaluates the same tokens.
  for (int64_t k = 0; k < int64_t(options_.eval.batches) * options_.data.grad_accum; ++k) {
    eval_data_.fill_batch(k, options_.data.batch, T, rank_offset_, rank_batch_, inputs_.data(), targets_.data());
    engine_->forward({inputs_.data(), targets_.data(), rank_batch_, T});
  }
  return engine_->finish_eval();
}

void Trainer::log_step(const StepResult& r, std::ostream* out) {
  if (world_.rank() != 0 || !out) return;
  const int steps = options_.optimizer.steps;
  const bool last = r.step == steps;
  if (r.step == 1 || r.step % options_.output.log_every == 0 || last) {
    const double eta = train_seconds_ / double(history_.size()) * (steps - r.step);
    *out << "step " << std::setw(5) << r.step << "/" << steps << "  loss " << std::fixed
         << std::setprecision(4) << r.loss << "  norm " << std::setprecision(3) << r.grad_norm << "  lr "
         << std::scientific << std::setprecision(2) << r.lr << std::fixed << "  "
         << std::setprecision(0) << r.tokens_per_s << " tok/s  " << std::setprecision(1) << r.ms
         << " ms  ETA " << std::setprecision(0) << eta << " s\n"
         << std::flush;
  }
  if (!r.resplit_seq_per_s.empty()) {
    *out << "step " << r.step << ": rank batches " << join_sizes(rank_batches_) << " (measured seq/s" << std::fixed
         << std::setprecision(1);
    for (size_t i = 0; i < r.resplit_seq_per_s.size(); ++i) *out << (i ? "," : " ") << r.resplit_seq_per_s[i];
    *out << ")\n" << std::flush;
  }
  if (!std::isnan(r.eval_loss))
    *out << "step " << r.step << ": eval loss " << std::fixed << std::setprecision(4) << r.eval_loss << "\n"
         << std::flush;
}

void Trainer::write_log_json() {
  const std::string& path = options_.output.log_json;
  if (path.empty()) return;
  run_agreed(world_, [&] {
    if (world_.rank() != 0) return;
    std::string text;
    for (const StepResult& r : history_) text += step_record(r).dump() + "\n";
    write_file_atomically(path, text);
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
  while (steps_done() < options_.optimizer.steps) {
    run_step(out);
    if (after_step && !after_step()) break;
  }
  // A resume with nothing left to train leaves the log it would replace (the earlier run's) as it is.
  // (--batch auto's measured steps are this run's too, and may be all of them.)
  if (!history_.empty()) write_log_json();
  if (out && world_.rank() == 0 && !history_.empty()) {
    // The steps' tokens over the steps' time (a mean of the steps' rates would weigh a short step as a
    // long one); the time in all adds evaluations and re-splits.
    double tokens = 0, step_s = 0;
    for (const auto& h : history_) {
      tokens += h.tokens_per_s * h.ms / 1e3;
      step_s += h.ms / 1e3;
    }
    *out << "done: " << history_.size() << " steps, loss " << std::fixed << std::setprecision(4)
         << history_.front().loss << " -> " << history_.back().loss << ", " << std::setprecision(0)
         << (step_s > 0 ? tokens / step_s : 0.0) << " tok/s over the steps' " << std::setprecision(1) << step_s
         << " s, " << train_seconds_ << " s in all\n";
  }
}

}  // namespace zshard
