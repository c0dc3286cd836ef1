#include <zshard/engine.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "comm/agreed_failure.h"
#include "comm/flight_recorder/recorder.h"
#include "comm/launch.h"
#include "kernels/engine_ops.h"
#include "shard/device_setup.h"
#include "shard/frozen_fingerprint.h"
#include "shard/memory/engine_report.h"
#include "shard/sharded_params.h"

namespace zshard {

Engine::Engine(Model& model, comm::Communicator& world, const ShardPlan& plan, const EngineOptions& options)
    : model_(model), world_(world), plan_(plan), options_(options) {
  ZS_CHECK(plan.world_size() == world.size(), "a plan for ", plan.world_size(), " ranks on a world of ", world.size());
  ZS_CHECK(options.grad_accum >= 1, "grad_accum must be >= 1, got ", options.grad_accum);
  ZS_CHECK(options.tokens_per_step >= 1, "tokens_per_step must be >= 1, got ", options.tokens_per_step);
  comm::maybe_stall_in_set_up(world.rank(), "engine");
  device_comm_ = open_device_comm(plan.comm, world);
  params_ = std::make_unique<ShardedParams>(model, device_comm_ ? *device_comm_ : world_, plan, options.seed,
                                            options.freeze);
  frozen_source_ = detail::concat("seed ", options.seed);
}

const std::string& Engine::frozen_fingerprint() {
  if (frozen_fingerprint_.empty()) frozen_fingerprint_ = zshard::frozen_fingerprint(*params_, world_);
  return frozen_fingerprint_;
}

void Engine::check_batch(const char* call, const Batch& batch) const {
  if (batch.B < 0 || batch.T < 0) fail(call, ": a batch of B = ", batch.B, ", T = ", batch.T, " (negative)");
  if (int64_t(batch.B) * batch.T > 0 && (!batch.inputs || !batch.targets))
    fail(call, ": a batch of B = ", batch.B, ", T = ", batch.T, " without ", batch.inputs ? "targets" : "inputs");
}

// The same values on every rank make the same refusal everywhere, before the step's first collective.
void Engine::check_adamw(const AdamW& hp) {
  const auto check = [](const char* name, float value, bool ok, const char* range) {
    if (!std::isfinite(value) || !ok) fail("step: AdamW::", name, " = ", value, " is not ", range);
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
  // Device memory first, in the order the members would go, so that the allocator's pool can give it
  // back for whatever runs next in this process (zshard-bench runs one engine per strategy).
  params_.reset();
  device_comm_.reset();
  release_cached_memory(plan_.placement.device);
}

double Engine::forward_backward(const Batch& batch) {
  ZS_CHECK(micro_steps_ < options_.grad_accum, "forward_backward: the step already has its ", options_.grad_accum,
           " micro-step(s); call step() first");
  check_batch("forward_backward", batch);
  if (micro_steps_ == 0) step_start_ = params_->comm_stats();
  params_->begin_micro_step(/*sync_grads=*/micro_steps_ == options_.grad_accum - 1);
  double loss = model_.forward_backward(*params_, batch, float(1.0 / double(options_.tokens_per_step)));
  params_->end_micro_step();
  // Read after the whole micro-step is queued: the model added to the device's sum in stream order, so
  // the host did not wait between forward and backward.
  loss += params_->take_loss_sum();
  ++micro_steps_;
  step_tokens_ += int64_t(batch.B) * batch.T;
  step_loss_sum_ += loss;
  return loss;
}

double Engine::forward(const Batch& batch) {
  check_batch("forward", batch);
  params_->begin_forward_only();
  double loss = model_.forward(*params_, batch);
  params_->end_micro_step();
  loss += params_->take_loss_sum();
  eval_loss_sum_ += loss;
  eval_tokens_ += int64_t(batch.B) * batch.T;
  return loss;
}

double Engine::finish_eval() {
  double sums[2] = {eval_loss_sum_, double(eval_tokens_)};
  eval_loss_sum_ = 0;
  eval_tokens_ = 0;
  comm::all_reduce_sum(world_, sums, 2);
  // The same sums everywhere: every rank refuses alike.
  if (sums[1] == 0) fail("finish_eval(): no rank evaluated a token since the last call: call forward first");
  return sums[0] / sums[1];
}

double Engine::grad_norm() {
  if (micro_steps_ != options_.grad_accum)
    fail("grad_norm() or step() after ", micro_steps_, " of the step's ", options_.grad_accum,
         " forward_backward call(s) (EngineOptions::grad_accum): call forward_backward first");
  if (step_norm_ >= 0) return step_norm_;
  agree_on_step();
  step_norm_ = params_->grad_norm();
  return step_norm_;
}

void Engine::agree_on_step() {
  // The gradient is scaled by 1 / tokens_per_step as each micro-step runs: a count that is not the ranks'
  // tokens would scale the whole step wrong, silently. Two scalars, the tokens and the loss, beside the
  // step's gradient traffic.
  double sums[2] = {double(step_tokens_), step_loss_sum_};
  {
    const comm::CollectiveLabel label(comm::trace::Purpose::step_tokens);
    world_.all_reduce(sums, 2, DType::f64, comm::ReduceOp::sum)->wait();
  }
  if (int64_t(sums[0]) != options_.tokens_per_step)
    throw AgreedFailure(detail::concat("step ", steps_done_ + 1, ": the ranks' micro-batches held ", int64_t(sums[0]),
                                       " tokens (B x T summed over ranks and micro-steps), but "
                                       "EngineOptions::tokens_per_step is ", options_.tokens_per_step,
                                       ": the gradient would not be their mean; stopped before the optimizer step"),
                        1, world_.rank() == 0);
  step_loss_ = sums[1] / double(options_.tokens_per_step);
}

StepStats Engine::step(const AdamW& hp) {
  check_adamw(hp);
  const double norm = grad_norm();
  const StepStats stats{.loss = step_loss_, .grad_norm = norm, .tokens = options_.tokens_per_step};
  // Both are all-reduced, so every rank stops here alike, before AdamW would spread the damage into the
  // weights and the optimizer state (and from there into a checkpoint).
  if (!std::isfinite(stats.loss) || !std::isfinite(stats.grad_norm))
    throw AgreedFailure(detail::concat("step ", steps_done_ + 1, ": non-finite ",
                                       std::isfinite(stats.loss) ? "gradient norm" : "loss", " (loss ", stats.loss,
                                       ", gradient norm ", stats.grad_norm,
                                       "); stopped before the optimizer step; nothing of this step is saved"),
                        1, world_.rank() == 0);
  // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1.
  float clip_scale = 1.0f;
  if (hp.grad_clip > 0) {
    const double coef = hp.grad_clip / (norm + 1e-6);
    if (coef < 1.0) clip_scale = float(coef);
  }
  params_->optimizer_step({hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, steps_done_ + 1, clip_scale});
  ops::synchronize(plan_.placement.device);  // the step's device work is queued, not yet done
  const comm::CommStats after = params_->comm_stats();
  last_step_comm_bytes_ = after.total_bytes() - step_start_.total_bytes();
  // Exposed communication: the host blocked in Work::wait() (mpi), or the compute stream stalled on a
  // collective, timed on the GPU (nccl; complete here since the device was synchronised above).
  last_step_exposed_ms_ = (after.seconds_waiting - step_start_.seconds_waiting) * 1e3;
  step_comm_.emplace_back(last_step_comm_bytes_, last_step_exposed_ms_);
  ++steps_done_;
  end_step();
  return stats;
}

void Engine::end_step() {
  micro_steps_ = 0;
  step_tokens_ = 0;
  step_loss_sum_ = 0;
  step_norm_ = -1;
}

void Engine::discard_step() {
  params_->discard_gradients();
  end_step();
}

comm::CommStats Engine::comm_stats() const { return params_->comm_stats(); }

void Engine::reset_comm_stats() { params_->reset_comm_stats(); }

MemoryReport Engine::memory_report() {
  return measure_memory(*params_, world_, options_.grad_accum, step_comm_);
}

}  // namespace zshard
