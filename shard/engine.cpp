#include <zshard/engine.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "comm/agreed_failure.h"
#include "comm/flight_recorder/recorder.h"
#include "comm/launch.h"
#include "kernels/engine_ops.h"
#include "shard/device_setup.h"
#include "shard/engine_internals.h"
#include "shard/engine_state.h"
#include "shard/frozen_fingerprint.h"
#include "shard/memory/engine_report.h"
#include "shard/plan_internals.h"
#include "shard/sharded_params.h"
#include "shard/step_graph.h"
#include "shard/unit_specs.h"

namespace zshard {

namespace {

// Engine::State::step_sums_, on the device: [StepScalars | a loss sum per micro-step | this rank's squared
// norm | every rank's]. The first two are what the step's end reads back, in one copy.
constexpr size_t kScalarDoubles = sizeof(ops::StepScalars) / sizeof(double);
static_assert(sizeof(ops::StepScalars) % sizeof(double) == 0, "the scalars are read back as doubles");

ops::StepScalars* scalars_in(const Tensor& sums) { return reinterpret_cast<ops::StepScalars*>(sums.data<double>()); }
double* micro_step_sums_in(const Tensor& sums) { return sums.data<double>() + kScalarDoubles; }

// The scalars at the front of what Engine::read_step_sums read.
static_assert(std::is_trivially_copyable_v<ops::StepScalars>, "read back as bytes");
ops::StepScalars scalars_read(const std::vector<double>& read) {
  ops::StepScalars s;
  std::memcpy(static_cast<void*>(&s), read.data(), sizeof s);
  return s;
}

}  // namespace

Engine::Engine(Model& model, comm::Communicator& world, const ShardPlan& plan, const EngineOptions& options)
    : model_(model), world_(world), plan_(plan), options_(options), state_(std::make_unique<State>()) {
  // A loop of one's own passes these: usage errors naming the field, as the plan's options get.
  if (plan.world_size() != world.size())
    refuse("Engine: the plan is for ", plan.world_size(), " rank(s) (resolve_plan's world), the world has ", world.size());
  if (options.grad_accum < 1) refuse("EngineOptions::grad_accum must be >= 1, got ", options.grad_accum);
  if (options.tokens_per_step < 1) refuse("EngineOptions::tokens_per_step must be >= 1, got ", options.tokens_per_step);
  check_groups_carry_quantization(plan);
  comm::maybe_stall_in_set_up(world.rank(), "engine");
  check_same_units_on_every_rank(model.units(), world);
  // First: its stream becomes the compute stream for all of the engine's work.
  if (options.cuda_graphs) {
    check_cuda_graphs(plan.placement, world.size());
    state_->graph_ = std::make_unique<StepGraph>(model, options.grad_accum);
  }
  // A recorded step's collectives are the self communicator's (one rank: copies at most, queued on the
  // compute stream), also under --comm mpi, whose world would pass device buffers through the host.
  state_->device_comm_ = open_device_comm(state_->graph_ ? CommBackend::nccl : plan.comm, world);
  comm::Communicator& collectives = state_->device_comm_ ? *state_->device_comm_ : world_;
  state_->params_ = std::make_unique<ShardedParams>(model, collectives, plan, options.seed, options.freeze);
  state_->frozen_source_ = detail::concat("seed ", options.seed);
  const int K = options.grad_accum;
  state_->step_sums_ = Tensor::zeros({int64_t(kScalarDoubles) + K + 1 + world.size()}, DType::f64,
                                     plan.placement.device, Category::workspace);
  state_->returned_losses_.assign(size_t(K), 0.0);
  if (plan.placement.device != Device::cpu)
    state_->step_settings_ = Tensor::empty({int64_t(sizeof(cpu::StepSettings) / sizeof(float))}, DType::f32,
                                           Device::cpu, Category::host);
}

const std::string& Engine::frozen_fingerprint() {
  std::string& fingerprint = state_->frozen_fingerprint_;
  if (fingerprint.empty()) fingerprint = zshard::frozen_fingerprint(*state_->params_, world_);
  return fingerprint;
}

void Engine::check_batch(const char* call, const Batch& batch) const {
  if (batch.B < 0 || batch.T < 0) fail(call, ": a batch of B = ", batch.B, ", T = ", batch.T, " (negative)");
  if (int64_t(batch.B) * batch.T > 0 && (!batch.inputs || !batch.targets))
    fail(call, ": a batch of B = ", batch.B, ", T = ", batch.T, " without ", batch.inputs ? "targets" : "inputs");
}

// The same values on every rank make the same refusal everywhere, before the step's first collective.
void Engine::check_adamw(const AdamW& hp) {
  const auto check = [](const char* name, float value, bool ok, const char* range) {
    if (!std::isfinite(value) || !ok) refuse("step: AdamW::", name, " = ", value, " is not ", range);
  };
  check("lr", hp.lr, hp.lr >= 0, "finite and >= 0");
  check("beta1", hp.beta1, hp.beta1 >= 0 && hp.beta1 < 1, "in [0, 1)");
  check("beta2", hp.beta2, hp.beta2 >= 0 && hp.beta2 < 1, "in [0, 1)");
  check("eps", hp.eps, hp.eps > 0, "finite and > 0");
  check("weight_decay", hp.weight_decay, hp.weight_decay >= 0, "finite and >= 0");
  check("grad_clip", hp.grad_clip, hp.grad_clip >= 0, "finite and >= 0 (0: no clipping)");
}

Engine::~Engine() {
  give_up_save_in_flight();
  if (state_->graph_) state_->graph_->drop();  // a recording an error left open would refuse the frees below
  // Device memory first, in the order the members would go, so that the allocator's pool can give it
  // back for whatever runs next in this process (zshard-bench runs one engine per strategy).
  state_->params_.reset();
  state_->step_sums_ = Tensor();
  state_->device_comm_.reset();
  state_->graph_.reset();  // last: the compute stream it set goes with it
  release_cached_memory(plan_.placement.device);
}

MicroStepLoss Engine::forward_backward(const Batch& batch) {
  if (state_->micro_steps_ >= options_.grad_accum)
    fail("forward_backward: the step already has its ", options_.grad_accum, " micro-step(s); call step() first");
  check_batch("forward_backward", batch);
  if (state_->micro_steps_ == 0) state_->step_start_ = state_->params_->comm_stats();
  const int k = state_->micro_steps_;
  if (state_->graph_) {
    try {
      const Batch staged = state_->graph_->stage(k, batch);
      if (k == 0) state_->graph_->begin_step();
      if (!state_->graph_->replaying()) run_micro_step(k, staged);
    } catch (...) {
      drop_deferred_step();
      throw;
    }
  } else {
    run_micro_step(k, batch);
  }
  ++state_->micro_steps_;
  state_->step_tokens_ += int64_t(batch.B) * batch.T;
  return MicroStepLoss(*this, state_->steps_ended_, k);
}

void Engine::drop_deferred_step() {
  if (!state_->graph_->deferred()) return;
  state_->graph_->drop();
  discard_step();
}

void Engine::run_micro_step(int k, const Batch& batch) {
  // The model adds its losses to the micro-step's own sum on the device, in stream order: nothing here
  // waits for the device.
  const bool last = k == options_.grad_accum - 1;
  state_->params_->begin_micro_step(/*sync_grads=*/last, micro_step_sums_in(state_->step_sums_) + k);
  const float loss_scale = float(1.0 / double(options_.tokens_per_step));
  try {
    state_->returned_losses_[size_t(k)] = model_.forward_backward(*state_->params_, batch, loss_scale);
    state_->params_->end_micro_step();
  } catch (...) {
    // The model, or the protocol it broke, left units held and gradients partial: the step is dropped, and
    // the next forward_backward starts a new one (as after a load).
    state_->params_->abandon_micro_step();
    discard_step();
    throw;
  }
  // A replay adds nothing on the host.
  if (state_->graph_ && state_->returned_losses_[size_t(k)] != 0)
    refuse(option_setting(Option::cuda_graphs, "on", "true"),
           ": the model returns its loss to the host (it does not add it to ParamContext::loss_sum())");
}

double MicroStepLoss::value() const { return engine_->micro_step_loss(step_, micro_step_); }

double Engine::micro_step_loss(int64_t step, int micro_step) {
  const size_t k = size_t(micro_step);
  if (step == state_->read_step_) return state_->read_sums_[kScalarDoubles + k];
  if (step == state_->previous_step_ && step + 1 == state_->steps_ended_) return state_->previous_losses_[k];
  if (step != state_->steps_ended_)
    refuse("MicroStepLoss: a micro-step's loss is kept until the end of the step after its own (or until its "
           "step is dropped: a load, a failed step); read it before then");
  if (state_->graph_ && state_->graph_->deferred())
    refuse("MicroStepLoss: with CUDA graphs the step's work runs in step(); read its losses after it");
  double added = 0;
  ops::read_back(plan_.placement.device, &added, micro_step_sums_in(state_->step_sums_) + k, sizeof added);
  return state_->returned_losses_[k] + added;
}

double Engine::forward(const Batch& batch) {
  check_batch("forward", batch);
  Batch model_batch = batch;
  if (state_->graph_) {
    if (state_->graph_->deferred()) refuse("forward(): with CUDA graphs, evaluate between steps, not inside one");
    state_->graph_->drop();  // the model may size its buffers anew for this batch
    model_batch = state_->graph_->stage_evaluation(batch);
  }
  state_->params_->begin_forward_only();
  double loss = 0;
  try {
    loss = model_.forward(*state_->params_, model_batch);
    state_->params_->end_micro_step();
  } catch (...) {
    state_->params_->abandon_micro_step();  // a forward touches no gradient: a step in progress goes on
    throw;
  }
  loss += state_->params_->take_loss_sum();
  state_->eval_loss_sum_ += loss;
  state_->eval_tokens_ += int64_t(batch.B) * batch.T;
  return loss;
}

double Engine::finish_eval() {
  double sums[2] = {state_->eval_loss_sum_, double(state_->eval_tokens_)};
  state_->eval_loss_sum_ = 0;
  state_->eval_tokens_ = 0;
  comm::all_reduce_sum(world_, sums, 2);
  // The same sums everywhere: every rank refuses alike.
  if (sums[1] == 0) fail("finish_eval(): no rank evaluated a token since the last call: call forward first");
  return sums[0] / sums[1];
}

double Engine::grad_norm() {
  if (state_->graph_ && state_->graph_->deferred())
    refuse("grad_norm(): with CUDA graphs the step's work runs in step(); read StepStats::grad_norm");
  queue_step_sums();
  if (state_->read_step_ != state_->steps_ended_) {
    // The settings are 0 until step() sets them: max_norm 0, the norm alone.
    ops::clip_grad_norm(plan_.placement.device, scalars_in(state_->step_sums_));
    read_step_sums();
  }
  return scalars_read(state_->read_sums_).norm;
}

void Engine::agree_on_step() {
  // The gradient is scaled by 1 / tokens_per_step as each micro-step runs: a count that is not the ranks'
  // tokens would scale the whole step wrong, silently. One scalar of the host's, beside the step's gradient
  // traffic.
  double tokens = double(state_->step_tokens_);
  {
    const comm::CollectiveLabel label(comm::trace::Purpose::step_tokens);
    world_.all_reduce(&tokens, 1, DType::f64, comm::ReduceOp::sum)->wait();
  }
  if (int64_t(tokens) != options_.tokens_per_step) {
    // Dropped, as a non-finite step is: the loop may go on with its next batch.
    discard_step();
    throw AgreedFailure(detail::concat("step ", state_->steps_done_ + 1, ": the ranks' micro-batches held ",
                                       int64_t(tokens), " tokens (B x T summed over ranks and micro-steps), but "
                                       "EngineOptions::tokens_per_step is ", options_.tokens_per_step,
                                       ": the gradient would not be their mean; stopped before the optimizer step"),
                        1, world_.rank() == 0);
  }
}

void Engine::check_micro_steps() const {
  if (state_->micro_steps_ != options_.grad_accum)
    fail("grad_norm() or step() after ", state_->micro_steps_, " of the step's ", options_.grad_accum,
         " forward_backward call(s) (EngineOptions::grad_accum): call forward_backward first");
}

void Engine::queue_step_sums() {
  check_micro_steps();
  if (state_->sums_queued_) return;
  agree_on_step();
  const Device device = plan_.placement.device;
  // This rank's losses in micro-step order: what the model returned (a model that adds on the device
  // returns 0), then the device's sums, each added once.
  double returned = 0;
  for (double loss : state_->returned_losses_) returned += loss;
  const size_t K = size_t(options_.grad_accum);
  ops::StepScalars* scalars = scalars_in(state_->step_sums_);
  double* micro_step_sums = micro_step_sums_in(state_->step_sums_);
  ops::sum_in_order(device, &scalars->loss_sum, micro_step_sums, K, returned);
  {
    // On the device's memory, by the communicator that takes it (NCCL's on GPUs): nothing is read back.
    const comm::CollectiveLabel label(comm::trace::Purpose::step_loss);
    comm::Communicator& world = EngineInternals::collective_world(*this);
    world.all_reduce(&scalars->loss_sum, 1, DType::f64, comm::ReduceOp::sum)->wait();
  }
  double* own_norm_squares = micro_step_sums + K;
  state_->params_->grad_norm_squares(own_norm_squares, own_norm_squares + 1, &scalars->norm_squares);
  state_->sums_queued_ = true;
}

void Engine::read_step_sums() {
  const size_t K = size_t(options_.grad_accum);
  if (state_->read_step_ != state_->steps_ended_ && !state_->read_sums_.empty()) {
    // The step before keeps its micro-steps' losses until this step ends (MicroStepLoss).
    state_->previous_losses_.assign(state_->read_sums_.begin() + kScalarDoubles, state_->read_sums_.end());
    state_->previous_step_ = state_->read_step_;
  }
  std::vector<double>& read = state_->read_sums_;
  read.resize(kScalarDoubles + K);
  ops::read_back(plan_.placement.device, read.data(), state_->step_sums_.raw(), read.size() * sizeof(double));
  // Each micro-step's loss as forward_backward's callers read it: what the model returned, plus its sum.
  for (size_t k = 0; k < K; ++k) read[kScalarDoubles + k] = state_->returned_losses_[k] + read[kScalarDoubles + k];
  state_->read_step_ = state_->steps_ended_;
}

void Engine::stop_if_not_finite() {
  const ops::StepScalars s = scalars_read(state_->read_sums_);
  if (!s.skip) return;
  // Both are all-reduced, so every rank stops here alike, and AdamW skipped the step on the device (the
  // offloaded one is not run): nothing of it reaches the weights, the optimizer state or a checkpoint.
  const double loss = s.loss_sum / double(options_.tokens_per_step);
  const std::string what =
      detail::concat("step ", state_->steps_done_ + 1, ": non-finite ", std::isfinite(loss) ? "gradient norm" : "loss",
                     " (loss ", loss, ", gradient norm ", s.norm,
                     "); stopped before the optimizer step; nothing of this step is saved");
  discard_step();
  throw AgreedFailure(what, 1, world_.rank() == 0);
}

StepStats Engine::step(const AdamW& hp) {
  check_adamw(hp);
  if (!state_->graph_) return take_step(hp);
  try {
    return take_step(hp);
  } catch (...) {
    drop_deferred_step();
    throw;
  }
}

StepStats Engine::take_step(const AdamW& hp) {
  const Device device = plan_.placement.device;
  cpu::StepSettings host_settings;
  const Tensor& pinned = state_->step_settings_;
  auto* settings = pinned.defined() ? reinterpret_cast<cpu::StepSettings*>(pinned.data<float>()) : &host_settings;
  *settings = {cpu::adamw_factors<float>({hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, state_->steps_done_ + 1}),
               hp.grad_clip};
  if (state_->graph_ && state_->graph_->replaying()) {
    // The recording queued all of what the else branch queues; the settings it copies are those just written.
    check_micro_steps();
    agree_on_step();
  } else {
    queue_step_sums();
    ops::set_step_settings(device, scalars_in(state_->step_sums_), settings);
    ops::clip_grad_norm(device, scalars_in(state_->step_sums_));
    if (plan_.placement.offload_optimizer) {
      // The host runs AdamW (ZeRO-Offload), so it reads the clip factor first, and stops before the update.
      read_step_sums();
      stop_if_not_finite();
      const ops::StepScalars on_host = scalars_read(state_->read_sums_);
      state_->params_->optimizer_step(&on_host);
      ops::synchronize(device);  // the uploads and the re-gather are queued, not yet done
      return end_taken_step();
    }
    // AdamW reads the clip factor on the device and skips a non-finite step there; the host reads the
    // step's sums once its whole work is queued, which waits for it to be done.
    state_->params_->optimizer_step(scalars_in(state_->step_sums_));
  }
  if (state_->graph_) state_->graph_->end_step();  // replays the step (a recording has not run yet either)
  read_step_sums();
  stop_if_not_finite();
  return end_taken_step();
}

StepStats Engine::end_taken_step() {
  const ops::StepScalars sums = scalars_read(state_->read_sums_);
  const StepStats stats{.loss = sums.loss_sum / double(options_.tokens_per_step),
                        .grad_norm = sums.norm,
                        .tokens = options_.tokens_per_step};
  const comm::CommStats after = state_->params_->comm_stats();
  state_->last_step_comm_bytes_ = after.total_bytes() - state_->step_start_.total_bytes();
  // Exposed communication: the host blocked in Work::wait() (mpi), or the compute stream stalled on a
  // collective, timed on the GPU (nccl; complete here since the device finished the step above).
  state_->last_step_exposed_ms_ = (after.seconds_waiting - state_->step_start_.seconds_waiting) * 1e3;
  state_->step_comm_.emplace_back(state_->last_step_comm_bytes_, state_->last_step_exposed_ms_);
  ++state_->steps_done_;
  end_step();
  return stats;
}

void Engine::end_step() {
  state_->micro_steps_ = 0;
  state_->step_tokens_ = 0;
  state_->sums_queued_ = false;
  std::fill(state_->returned_losses_.begin(), state_->returned_losses_.end(), 0.0);
  state_->step_sums_.zero_();  // queued on the device behind the step's reads
  ++state_->steps_ended_;
}

void Engine::discard_step() {
  // A load or an import may put other buffers where the recording reads.
  if (state_->graph_) state_->graph_->drop();
  state_->params_->discard_gradients();
  end_step();
}

int Engine::steps_done() const { return state_->steps_done_; }

int64_t Engine::last_step_comm_bytes() const { return state_->last_step_comm_bytes_; }

double Engine::last_step_comm_exposed_ms() const { return state_->last_step_exposed_ms_; }

comm::CommStats Engine::comm_stats() const { return state_->params_->comm_stats(); }

void Engine::reset_comm_stats() {
  state_->params_->reset_comm_stats();
  state_->step_comm_.clear();  // the memory report's per-step means start again too (a benchmark's warm-up)
}

MemoryReport Engine::memory_report() {
  return measure_memory(*state_->params_, world_, options_.grad_accum, state_->step_comm_);
}

}  // namespace zshard
