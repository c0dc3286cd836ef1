// Gradient accumulation: the life of a micro-step. A step is grad_accum micro-steps (Engine::
// forward_backward) before one optimizer step, and its gradient is their sum, exactly the gradient of
// the whole batch at once:
//   - begin_micro_step says whether this micro-step reduces: ddp and zero1 keep their full gradients
//     resident and reduce on the last micro-step only (no_sync, grads_ready in grad_reduction.cpp
//     returning early); zero2, zero3 and hybrid reduce-scatter every micro-step, and the shards add up
//     in the owned gradients, so no full gradient outlives its unit's backward;
//   - end_micro_step checks the protocol, waits for the reductions still in flight and frees what the
//     prefetch gathered but the model did not use;
//   - abandon_micro_step takes end_micro_step's place after the model threw: the next micro-step finds
//     no unit held and no reduction in flight;
//   - discard_gradients zeroes the owned gradients, after a step or instead of one (a load, a micro-step
//     abandoned), and the next micro-step starts a new step.
#include "shard/sharded_params.h"

#include <zshard/error.h>

#include "comm/backend_base.h"
#include "shard/optimizer_offload.h"

namespace zshard {

using namespace sharded;

void ShardedParams::begin_micro_step(bool sync_grads, double* loss_sum) {
  loss_target_ = loss_sum ? loss_sum : loss_sum_.data<double>();
  first_micro_step_ = !accumulated_;
  accumulated_ = true;
  sync_grads_ = sync_grads;
  in_backward_ = false;
  gather_position_ = 0;
  order_ = &training_order_;
}

void ShardedParams::begin_forward_only() {
  loss_target_ = loss_sum_.data<double>();
  in_backward_ = false;
  gather_position_ = 0;
  order_ = &forward_only_order_;
}

void ShardedParams::end_micro_step() {
  // The protocol first, on every strategy: gradients never made ready would silently miss the reduction.
  for (auto& u : units_) {
    if (u->gather_refs != 0) fail("unit ", u->layout.spec().name, " still gathered at the end of a micro-step");
    if (u->grads_state == Unit::Grads::requested)
      fail("unit ", u->layout.spec().name, ": grads() without grads_ready() in this micro-step");
  }
  // A trainable unit whose gradients were never handed back would not train, silently, and where the
  // ranks differ their reductions would part (as torch's DDP refuses unused parameters by default).
  for (auto& u : units_) {
    if (!forward_only() && u->trainable() && u->grads_state != Unit::Grads::ready)
      fail("unit ", u->layout.spec().name,
           ": no grads_ready() in this micro-step's backward (every unit with trainable parameters hands back "
           "its gradients, zero where it was not used)");
    u->grads_state = Unit::Grads::untouched;
  }
  while (!reductions_.empty()) finish_oldest_reduction();
  for (auto& u : units_) {
    if (u->gathered.defined()) free_gathered(*u);  // a prefetch the model did not use
    u->secondary = Tensor();  // a share kept after forward that backward did not gather
    u->frozen_secondary = Tensor();
  }
  order_->recorded = true;
}

void ShardedParams::abandon_micro_step() {
  const auto settle = [](comm::WorkPtr& work) {
    if (work && !comm::collectives_failed()) {
      try {
        work->wait();
      } catch (const Error&) {
        // It marked the collectives failed: the model's error, already on its way, is the one to report.
      }
    }
    work.reset();
  };
  for (Reduction& r : reductions_) settle(r.work);
  reductions_.clear();
  for (auto& u : units_) {
    settle(u->gather_work);
    settle(u->frozen_gather_work);
    u->received = Tensor();
    u->frozen_received = Tensor();
    if (u->gathered.defined()) free_gathered(*u);
    u->secondary = Tensor();
    u->frozen_secondary = Tensor();
    u->gather_refs = 0;
    u->grads_state = Unit::Grads::untouched;
    if (grads_sharded_) {  // a transient full gradient (resident ones are grad_store itself)
      u->full_grads = Tensor();
      u->grad_views.clear();
    }
  }
  in_backward_ = false;
  if (forward_only()) loss_sum_.zero_();  // what the model added before it threw: no later forward's
  // A first micro-step cut short recorded part of the gather order: the next one records it anew.
  if (!order_->recorded) {
    order_->units.clear();
    if (order_ == &training_order_) first_step_gathered_numel_ = first_step_secondary_numel_ = 0;
  }
}

void ShardedParams::discard_gradients() {
  if (offload_) offload_->drop_gradients();  // and those on their way to the host
  for (auto& u : units_) u->grad_store.zero_();
  accumulated_ = false;
}

}  // namespace zshard
