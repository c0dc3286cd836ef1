// The gradients' side of the protocol: the full-size buffers the model accumulates into, and the
// reduction each grads_ready() starts: reduce-scatter in the shard group (or, quantized, an all-to-all of
// quantized chunks that each owner sums), all-reduce across groups.
#include "shard/sharded_params.h"

#include "comm/flight_recorder/recorder.h"
#include "shard/optimizer_offload.h"

namespace zshard {

using namespace sharded;

const UnitTensors& ShardedParams::grads(int unit) {
  if (unit < 0 || unit >= num_units()) fail("grads of unknown unit ", unit);
  Unit& u = *units_[unit];
  if (forward_only()) fail("grads() of unit ", u.layout.spec().name, " in a forward-only micro-step");
  in_backward_ = true;
  if (u.grads_state == Unit::Grads::ready)
    fail("grads() of unit ", u.layout.spec().name, " after its grads_ready() in this micro-step");
  u.grads_state = Unit::Grads::requested;
  if (!u.trainable()) {  // every entry undefined: nothing to accumulate, nothing to reduce
    if (u.grad_views.empty()) u.grad_views = in_unit_order(u.slots, {}, {});
    return u.grad_views;
  }
  if (!u.full_grads.defined()) {
    fit_reductions_beside(u);
    u.full_grads =
        Tensor::zeros({u.layout.padded_numel()}, u.grad_store.dtype(), plan_.placement.device, Category::comm);
    u.grad_views = in_unit_order(u.slots, u.layout.views(u.full_grads), {});
  }
  return u.grad_views;
}

void ShardedParams::grads_ready(int unit) {
  if (unit < 0 || unit >= num_units()) fail("grads_ready of unknown unit ", unit);
  Unit& u = *units_[unit];
  // Checked before any collective: a second reduction of the same gradients would be silently wrong.
  if (u.grads_state == Unit::Grads::ready)
    fail("grads_ready for unit ", u.layout.spec().name, " twice in one micro-step");
  if (u.grads_state != Unit::Grads::requested)
    fail("grads_ready for unit ", u.layout.spec().name, " without grads()");
  u.grads_state = Unit::Grads::ready;
  // Every rank freezes the same parameters, so every rank skips the same units' collectives.
  if (!u.trainable()) return;
  if (!sync_grads_ && !grads_sharded_) return;  // no_sync: keep accumulating locally
  // Across groups (ddp, hybrid), earlier units move on to their all-reduce here, before this unit's
  // reduce-scatter, and nowhere else but the end of the micro-step: a fixed point of the program, so
  // every rank issues the shard and replica groups' collectives in the same order. NCCL requires that
  // (collectives of two communicators issued in different orders can deadlock), and it would not hold
  // if each all-reduce started when its rank happened to see its reduce-scatter finish. The wait this
  // implies has had a whole unit's backward to finish, and on a device it only orders the streams.
  if (comms_.across_groups())
    for (Reduction& earlier : reductions_)
      if (!earlier.all_reduce_started) start_all_reduce(earlier);
  Reduction r;
  r.unit = unit;
  r.send = u.full_grads;
  const Device device = plan_.placement.device;
  const DType reduce = plan_.placement.reduce_dtype;
  // With no collective at all (a world of one), a differing reduce dtype would only add two conversions.
  // Quantized chunks are cut from the gradient as it is: the quantizer computes in fp32 whatever it reads.
  const bool communicates = shard_group_size() > 1 || comms_.across_groups();
  const bool quantized = plan_.quantize_reductions != ReductionQuantization::none && shard_group_size() > 1;
  if (reduce != r.send.dtype() && communicates && !quantized) {
    r.send = Tensor::empty(u.full_grads.shape(), reduce, device, Category::comm);
    ops::convert(device, r.send.raw(), reduce, u.full_grads.raw(), u.full_grads.dtype(),
                 size_t(u.full_grads.numel()));
  }
  const int64_t shard = u.layout.shard_numel();
  if (shard_group_size() > 1) {
    // Sharded gradients that are still zero (the first micro-step of a step) take the reduced shard as it
    // is: the reduce-scatter writes straight into them, and no shard-sized scratch is allocated.
    const Tensor owned = owned_grads(unit);
    r.lands_in_place = grads_sharded_ && first_micro_step_ && owned.dtype() == reduce;
    r.scratch = r.lands_in_place ? owned : Tensor::empty({shard}, reduce, device, Category::comm);
    const comm::CollectiveLabel label(comm::trace::Purpose::grads, unit);
    // The full gradient is not read again once reduced (zero1's resident one is zeroed at the step's
    // end): the mpi backend's ring sums in it rather than in buffers of its own.
    r.work = quantized ? exchange_quantized_chunks(u, r)
                       : comms_.shard().reduce_scatter_consuming(r.send.raw(), r.scratch.raw(), shard, reduce,
                                                                 comm::ReduceOp::sum);
  } else {
    r.scratch = r.send;  // a group of one: the full buffer is the shard
  }
  if (!r.work && comms_.across_groups()) start_all_reduce(r);  // no reduce-scatter to wait for
  reductions_.push_back(std::move(r));
  poll_reductions();
  // Sharded gradients: a unit's full gradient lives until its reduction lands, and nothing guarantees
  // that a reduction progresses on its own (MPI's non-blocking collectives move only when polled). So
  // the earlier reductions are finished here, once this unit's is issued: they have had this unit's
  // whole backward to progress, and the full gradients alive stay two whatever the depth of the model,
  // this unit's in flight and the next one's being accumulated (FSDP2 keeps the same two), or the
  // largest unit's alone where it does not fit the budget beside another (fit_reductions_beside). zero1 is
  // held to the same bound for its shard-sized scratch. ddp reduces in place and on a GPU is left to
  // overlap freely; on the cpu, where a reduction moves only when polled anyway, it is held to the bound
  // too: each of its all-reduces takes a chunk of scratch (comm/ring_reduction.h), and in bf16 a unit's
  // fp32 copy, which it would otherwise hold for every unit until the micro-step's end.
  if (shard_group_size() > 1 || grads_sharded_ || plan_.placement.device == Device::cpu)
    while (reductions_.size() > 1) finish_oldest_reduction();
}

comm::WorkPtr ShardedParams::exchange_quantized_chunks(const Unit& u, Reduction& r) {
  const ChunkBlockTables& blocks = u.reduction_blocks;
  const int64_t shard = u.layout.shard_numel();
  const ops::QuantizedSize& size = blocks.record();
  const int64_t words = int64_t(size.bytes() / sizeof(int32_t)), group = shard_group_size();
  const Device device = plan_.placement.device;
  // Zeroed: a chunk with fewer blocks than the record holds leaves scale slots unwritten, and what goes on
  // the wire should not be whatever the allocator held.
  r.send = Tensor::zeros({group * words}, DType::i32, device, Category::comm);
  with_element_type(u.full_grads.dtype(), [&](auto t) {
    using T = decltype(t);
    for (int owner = 0; owner < group; ++owner) {
      auto* record = static_cast<int8_t*>(r.send.raw()) + size_t(owner) * size.bytes();
      ops::quantize_blocks(device, record, reinterpret_cast<float*>(record + size.scales_offset()),
                           u.full_grads.data<T>() + u.layout.shard_begin(owner), size_t(shard), blocks.format(),
                           blocks.chunk(owner));
    }
  });
  r.received = Tensor::empty({group * words}, DType::i32, device, Category::comm);
  return comms_.shard().all_to_all(r.send.raw(), r.received.raw(), size_t(words), DType::i32);
}

void ShardedParams::sum_received_chunks(Reduction& r) {
  if (!r.received.defined()) return;
  const Unit& u = *units_[r.unit];
  const ChunkBlockTables& blocks = u.reduction_blocks;
  const size_t shard = size_t(u.layout.shard_numel());
  const ops::QuantizedSize& size = blocks.record();
  const Device device = plan_.placement.device;
  // The sum is kept in fp32 whatever the reduce dtype, and rounded to it once, at the end.
  const Tensor sum =
      r.scratch.dtype() == kF32 ? r.scratch : Tensor::empty({int64_t(shard)}, kF32, device, Category::comm);
  for (int source = 0; source < shard_group_size(); ++source) {
    const auto* record = static_cast<const int8_t*>(r.received.raw()) + size_t(source) * size.bytes();
    const auto* scales = reinterpret_cast<const float*>(record + size.scales_offset());
    ops::dequantize_blocks(device, sum.data<float>(), record, scales, shard, blocks.format(),
                           blocks.chunk(shard_index()), source > 0);
  }
  if (sum.raw() != r.scratch.raw()) ops::convert(device, r.scratch.raw(), r.scratch.dtype(), sum.raw(), kF32, shard);
  r.received = Tensor();
  r.send = Tensor();
}

void ShardedParams::fit_reductions_beside(const Unit& opening) {
  // Every rank opens the same units in the same order and the budget is in elements, so the ranks agree
  // on which reductions to finish here; under hybrid none has started its all-reduce (those start at
  // fixed points only, and polling cannot finish one before), so the collectives this may start are
  // issued on every rank alike.
  int64_t in_flight = 0;
  for (const Reduction& r : reductions_) in_flight += units_[r.unit]->layout.padded_numel();
  while (!reductions_.empty() && in_flight + opening.layout.padded_numel() > full_grads_budget_) {
    in_flight -= units_[reductions_.front().unit]->layout.padded_numel();
    finish_oldest_reduction();
  }
}

void ShardedParams::finish_oldest_reduction() {
  advance(reductions_.front(), true);
  reductions_.pop_front();
}

void ShardedParams::start_all_reduce(Reduction& r) {
  if (r.work) r.work->wait();
  sum_received_chunks(r);
  // Sharded gradients: the full gradient is spent once reduced in the group, and goes before the all-reduce
  // across groups takes its scratch.
  if (grads_sharded_ && shard_group_size() > 1) release_full_gradient(r);
  const comm::CollectiveLabel label(comm::trace::Purpose::grads_across, r.unit);
  r.work = comms_.all_reduce_across_groups(r.scratch.raw(), r.scratch.numel(), r.scratch.dtype());
  r.all_reduce_started = true;
}

bool ShardedParams::advance(Reduction& r, bool blocking) {
  if (comms_.across_groups() && !r.all_reduce_started) {
    if (!blocking) return false;  // all-reduces start at fixed points only (see grads_ready)
    start_all_reduce(r);
  }
  if (r.work) {
    if (blocking) {
      r.work->wait();
    } else if (!r.work->test()) {
      return false;
    }
    r.work.reset();
  }
  sum_received_chunks(r);
  // The reduced shard lands in the owned gradients, converted when the reduce dtype differs: added for
  // sharded grads (they accumulate over micro-steps), copied into the owned slice for zero1, already in
  // place for ddp.
  Unit& u = *units_[r.unit];
  const Tensor dest = owned_grads(r.unit);
  if (dest.raw() != r.scratch.raw() && !r.lands_in_place) {
    if (grads_sharded_) {
      accumulate(plan_.placement.device, dest, r.scratch);
    } else {
      ops::convert(plan_.placement.device, dest.raw(), dest.dtype(), r.scratch.raw(), r.scratch.dtype(),
                   size_t(dest.numel()));
    }
  }
  if (grads_sharded_) release_full_gradient(r);
  if (offload_ && sync_grads_) offload_->grads_landed(r.unit);  // final for this step: off to the host
  return true;
}

void ShardedParams::release_full_gradient(Reduction& r) {
  Unit& u = *units_[r.unit];
  u.full_grads = Tensor();
  u.grad_views.clear();
  r.send = Tensor();
}

void ShardedParams::poll_reductions() {
  while (!reductions_.empty() && advance(reductions_.front(), false)) reductions_.pop_front();
  // Later reductions are tested too so that MPI progresses them while the model computes.
  for (auto& r : reductions_) if (r.work) r.work->test();
}

}  // namespace zshard
