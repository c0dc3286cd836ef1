// ShardedParams: the runtime side of the model API. It owns every unit's parameters, gradients and
// AdamW state as the strategy prescribes, on the run's device, and implements gather / release / grads /
// grads_ready:
//
//   gather(u)       sharded params: all-gather the unit into a transient buffer (waiting on a prefetch
//                   when one is in flight) and start the next unit's gather, in the order recorded on
//                   the first micro-step; resident params: hand out views.
//   release(u)      sharded params: free the gathered buffer (kept until backward when
//                   reshard_after_forward is off; with secondary groups, zero3 keeps this rank's share of
//                   it in its group, and the next gather of the unit runs inside that group).
//   grads(u)        the full-size gradient buffer the model accumulates into: resident (ddp, zero1) or
//                   transient (zero2/3, hybrid), opened on the first call of a micro-step once the
//                   reductions in flight fit the budget beside it (full_grads_budget_).
//   grads_ready(u)  starts the unit's reduction at once, so it overlaps the rest of backward:
//                   reduce-scatter in the shard group (quantized: shard/reduction_quantization.h),
//                   then all-reduce across replicas, then the result
//                   lands in the owned gradient shard. ddp and zero1 skip it until the last micro-step of
//                   an accumulation (no_sync); zero2/3 and hybrid reduce every micro-step so that no full
//                   gradient outlives its unit's backward.
//
// Dtypes (Placement). Every buffer lives on placement.device; three dtypes are in play:
//   master     fp32, this rank's owned shard: what AdamW updates and what checkpoints and exports save.
//   params     the compute copy the model reads, in the param dtype (f32 or bf16): full on every
//              rank where parameters are resident (ddp, zero1, zero2), this rank's shard where they are
//              sharded (zero3, hybrid). Gathers all-gather compute-dtype shards, so bf16 halves them.
//              With fp32 parameters the master IS the compute copy (its owned slice, or the shard): one
//              buffer, counted as params. With bf16 the master is a buffer of its own, counted as
//              optimizer state beside Adam m and v: K = 12 bytes per parameter, the ZeRO paper's.
//   grads      the param dtype everywhere: the full accumulators the model writes and the owned store.
//              params + grads + optimizer are then exactly the ZeRO formulas (16 bytes per parameter in
//              bf16 with K = 12, and in fp32 with K = 8), and AdamW reads the gradients as they are.
// The reduce dtype is the dtype of the gradient collectives only. When it differs from the gradient
// dtype, the unit's gradient is converted into a comm buffer, reduced there, and the reduced shard is
// converted back into (or added to) the owned gradients. Keeping the gradients themselves in an fp32
// reduce dtype was the alternative; it would make the owned store 4 bytes per element under bf16 and the
// model states no longer the paper's, while the conversion costs only a transient buffer per unit in
// flight (an fp32 reduction still sums in fp32 and rounds once, when it lands: onto the zeroed gradients
// of a step's first micro-step; with accumulation the later micro-steps' shards are rounded to bf16 and
// then added in bf16, a second rounding, where a mixed add would round once).
// AdamW steps the fp32 master shard from the owned gradients and, with bf16 parameters, writes the bf16
// compute copy in the same pass: the owned slice of the full copy (then all-gathered, as in fp32) or
// the shard.
//
// Quantized gathers (ShardPlan::quantize_gathers int8, shard/gather_quantization.h): each rank keeps its
// shard of the compute copy also quantized, refreshed whenever the shard changes (set-up, set_unit_params,
// a load, AdamW; the frozen shard once, when set), so that every gather sends that record as it is. A
// gather lands every rank's record, its own included, and dequantizes them all into the gathered buffer:
// the owner too computes with the dequantized values rather than its exact ones, so every rank of a group
// holds the same weights, as the gradients' reduction assumes and as a run of any world size with the same
// shards reproduces. Unequal hybrid groups cut their blocks at their own shards' boundaries: a block that
// straddles one group size's boundary is two blocks there and one in the other group, its elements
// rounded on different scales (within the quantization error); the fp32 masters stay the same. The records
// and their block tables (shard/chunk_blocks.h) count as params (and frozen), the received records as comm.
#pragma once
#include <deque>
#include <memory>
#include <vector>

#include <zshard/communicator.h>
#include <zshard/model.h>
#include <zshard/plan.h>

#include "kernels/engine_ops.h"
#include "shard/chunk_blocks.h"
#include "shard/flat_unit.h"
#include "shard/frozen_params.h"
#include "shard/group_comms.h"

namespace zshard {

class OptimizerOffload;

// Told before AdamW changes a unit's owned master, m and v: an asynchronous save writing them from where
// they live copies what it has not written yet (shard/copy_on_update.h).
class UpdateGuard {
 public:
  virtual void before_update(int unit) = 0;

 protected:
  ~UpdateGuard() = default;
};

class ShardedParams : public ParamContext {
 public:
  // Collective over `comm`, which the plan's groups split from (it has the plan's world size) and whose
  // collectives carry the plan's device buffers; `comm` must outlive this object. Parameters start from
  // model.init_unit(seed), computed on the host. The parameters ParamSpec::frozen marks, and those a
  // `freeze` pattern matches (shard/frozen_params.h), keep a compute copy only.
  ShardedParams(const Model& model, comm::Communicator& comm, const ShardPlan& plan, uint64_t seed,
                const std::vector<std::string>& freeze = {});
  ~ShardedParams() override;

  // ParamContext
  const UnitTensors& gather(int unit) override;
  void release(int unit) override;
  const UnitTensors& grads(int unit) override;
  void grads_ready(int unit) override;
  Device device() const override { return plan_.placement.device; }
  DType compute_dtype() const override { return plan_.placement.param_dtype; }
  double* loss_sum() override { return loss_target_; }
  // What the model added to its own sum since the last call (a forward-only micro-step's, or a micro-step's
  // given no sum of the caller's), read back (a device wait) and reset.
  double take_loss_sum();

  // Step protocol, driven by the engine: the micro-step's life is in shard/grad_accumulation.cpp.
  // sync_grads false = accumulate locally (ddp/zero1 no_sync). The model adds its token losses to
  // `loss_sum`, a double on the device, when given (the engine keeps a step's sums there until its end),
  // else to the sum take_loss_sum reads.
  void begin_micro_step(bool sync_grads, double* loss_sum = nullptr);
  // A forward-only micro-step (Model::forward, for evaluation): gathers and releases only; grads() is
  // refused. The gradients and the optimizer state are left as they are.
  void begin_forward_only();
  void end_micro_step();  // after either; waits for every reduction still in flight
  // Instead of end_micro_step, after the model threw inside either: the collectives it started are waited
  // for (their buffers outlive them, and an in-place reduction would write into gradients zeroed after it;
  // the peers that threw alike issued them too; not once the communication itself failed), what it held is
  // freed, a forward-only loss sum dropped and every unit's protocol state reset. The micro-step's gradients
  // are partial: drop them (discard_gradients).
  void abandon_micro_step();
  // The step's end, in device memory, with nothing read back (shard/optimizer_step.cpp): *own := this rank's
  // sum of squares of its owned gradients (one launch per unit, the padding left out), then *norm_squares
  // := the world's (GroupComms::sum_of_partition, through `gathered`). Collective.
  void grad_norm_squares(double* own, double* gathered, double* norm_squares);
  // AdamW on the owned shards (one launch per unit), scaled and skipped as `step` says, then zero grads and
  // re-gather. `step` is where AdamW runs: the device's memory, or the host's with offload_optimizer.
  void optimizer_step(const ops::StepScalars* step);
  void discard_gradients();  // zero, and the next micro-step starts a step: after a step, or instead of one

  // Layout and owned state, for checkpoints, exports and reports.
  int num_units() const { return int(units_.size()); }
  // The trainable parameters' layout: what the gradients, AdamW, checkpoints and the norm cover. A unit
  // without frozen parameters has them all.
  const FlatLayout& layout(int unit) const;
  const FlatLayout& frozen_layout(int unit) const;  // the frozen parameters' (numel 0 without any)
  int64_t frozen_numel() const;  // elements of every unit's frozen parameters
  std::vector<UnitSpec> trainable_units() const;  // each unit's trainable parameters: what a checkpoint holds
  int shard_index() const { return comms_.shard_index(); }
  int shard_group_size() const { return comms_.shard_group_size(); }  // this rank's group
  const ShardGroups& groups() const { return comms_.groups(); }
  const ShardPlan& plan() const { return plan_; }
  const Placement& placement() const { return plan_.placement; }
  // The owned shard (shard_numel elements) of the fp32 master params, the gradients (param dtype), Adam m
  // and Adam v: on the device, except the master, m and v with offload_optimizer (host memory).
  Tensor owned_params(int unit) const;
  Tensor owned_grads(int unit) const;
  Tensor adam_m(int unit) const;
  Tensor adam_v(int unit) const;
  // This rank's shard (frozen_layout's shard_numel) of the frozen parameters' compute copy; undefined
  // without any.
  Tensor owned_frozen(int unit) const;
  // At most one guard, until set back to nullptr. Whatever changes a unit's owned master, m or v (AdamW,
  // set_unit_params, a load) calls before_owned_change(unit) first, which tells the guard.
  void set_update_guard(UpdateGuard* guard) { update_guard_ = guard; }
  void before_owned_change(int unit) {
    if (update_guard_) update_guard_->before_update(unit);
  }
  // After writing owned master shards directly (loading), makes the compute copies consistent.
  // Collective.
  void sync_resident_params();
  // Sets a unit's trainable parameters from a full flat host buffer (layout's padded_numel floats), every
  // rank the same.
  void set_unit_params(int unit, const float* full);
  // Sets its frozen parameters the same way (frozen_layout's padded_numel floats).
  void set_frozen_params(int unit, const float* full);
  // Full flat fp32 master parameters of a unit (padded_numel, host), all-gathered. Collective.
  FlatValues full_unit_params(int unit);
  // Every parameter of a unit, trainable and frozen, in UnitSpec order (FlatLayout(spec, 1), host, fp32;
  // frozen ones as their compute copy holds them). Collective.
  FlatValues whole_unit_params(int unit);
  // Sharded params: the elements a micro-step all-gathers for the model, as the first micro-step recorded
  // them (0 before it). 2Ψ where every unit is gathered for forward and again for backward; less without
  // resharding after forward, or for a model whose backward reuses a forward gather or needs none (an
  // embedding). Prefetches the model does not use are not in it.
  int64_t gathered_numel_per_micro_step() const { return first_step_gathered_numel_; }
  // Of those, the elements gathered inside the secondary groups from the shares kept after forward (0
  // without secondary groups).
  int64_t secondary_gathered_numel_per_micro_step() const { return first_step_secondary_numel_; }
  // Bytes moved by this rank's communicators since the last reset.
  comm::CommStats comm_stats() const;
  void reset_comm_stats();

 private:
  struct Unit;
  struct Reduction {
    int unit = 0;
    bool all_reduce_started = false;  // across groups (ddp, hybrid): work is the all-reduce, the reduce-scatter done
    comm::WorkPtr work;
    // The unit's gradient in the reduce dtype (the full gradient itself when they agree); quantized
    // reductions: its G chunk records, i32 words, until the all-to-all is done.
    Tensor send;
    Tensor received;  // quantized reductions: every rank's record of this rank's chunk, until summed
    Tensor scratch;   // the reduced shard, in the reduce dtype
    bool lands_in_place = false;  // scratch is the owned gradient shard itself
  };

  Tensor owned_compute(const Unit& u) const;  // this rank's part of the compute copy
  // Writes this rank's part of a compute-copy buffer (full, or the shard) from a full flat host buffer.
  void upload(const FlatLayout& layout, const Tensor& resident, const float* full);
  FlatValues full_frozen_params(int unit);  // frozen_layout's padded_numel, fp32, host; collective
  void copy_master_to_compute(int unit);  // where the master is a buffer of its own
  // all_gather over the shard group; a group of one is a device copy (null Work): it moves nothing,
  // and the self backend copies host memory only.
  comm::WorkPtr gather_shards(const void* send, void* recv, int64_t shard_numel, DType dtype);
  // Quantized gathers: `quantized` := the record of this rank's shard of `resident`, in the blocks of
  // `blocks` (no-op otherwise).
  void quantize_shard(const FlatLayout& layout, const ChunkBlockTables& blocks, const Tensor& resident,
                      const Tensor& quantized);
  // Secondary groups (ShardPlan::secondary_groups), whose shares are FlatLayout::share_numel of the group's
  // size: this rank's share of a gathered buffer (undefined for a layout without parameters), and the
  // all-gather of the shares back into a buffer of at least padded_numel.
  Tensor secondary_share(const FlatLayout& layout, const Tensor& gathered);
  comm::WorkPtr gather_secondary_shares(const FlatLayout& layout, const Tensor& share, const Tensor& gathered);
  // Starts the gather of one flat buffer into `gathered`: the compute shards, or the records into
  // `received` (allocated here).
  comm::WorkPtr start_buffer_gather(const FlatLayout& layout, const Tensor& resident, const Tensor& quantized,
                                    const Tensor& gathered, Tensor& received);
  // After its gather: every rank's record in `received` dequantized into `gathered`, and `received` freed.
  void dequantize_received(const FlatLayout& layout, const ChunkBlockTables& blocks, Tensor& received,
                           const Tensor& gathered);
  void gather_resident_params();
  void start_gather(int unit);
  void finish_gather(Unit& u);
  void prefetch_after(size_t position);
  void free_gathered(Unit& u);
  // Quantized reductions: quantizes u's gradient into r.send chunk by chunk and starts their all-to-all
  // into r.received.
  comm::WorkPtr exchange_quantized_chunks(const Unit& u, Reduction& r);
  // Once that all-to-all is done: r.scratch := the sum of the received chunks (no-op otherwise).
  void sum_received_chunks(Reduction& r);
  void start_all_reduce(Reduction& r);  // waits for r's reduce-scatter, then starts its all-reduce
  bool advance(Reduction& r, bool blocking);
  // Sharded gradients: drops r's unit's full gradient (and r's copy of it), reduced in the group.
  void release_full_gradient(Reduction& r);
  void finish_oldest_reduction();
  void fit_reductions_beside(const Unit& opening);  // see full_grads_budget_
  void poll_reductions();
  int inflight_units() const;

  ShardPlan plan_;
  GroupComms comms_;
  bool params_sharded_;
  bool grads_sharded_;
  bool quantized_gathers_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::deque<Reduction> reductions_;
  std::unique_ptr<OptimizerOffload> offload_;  // with plan_.placement.offload_optimizer
  UpdateGuard* update_guard_ = nullptr;
  Tensor loss_sum_;  // one double on the device: the token losses since take_loss_sum()
  double* loss_target_ = nullptr;  // where the model adds its losses now: loss_sum_, or the engine's
  // Sharded gradients: the elements of full unit gradients that the reductions in flight and the one
  // being opened may hold together, max(largest unit, 2 x second largest). Two ordinary units always fit
  // (one accumulated while the other's reduction overlaps it), so a model of like units keeps that
  // overlap; a unit larger than that, such as GPT-2's embedding with its tied head, opens only once the
  // reductions in flight have landed: it costs the overlap of the one reduction before it, and the peak
  // is the largest unit's gradient alone rather than that plus another. Gradients the model keeps open
  // across other units' backward are not in flight and not counted: they cannot be finished early.
  int64_t full_grads_budget_ = 0;

  bool sync_grads_ = true;
  // The owned gradients hold nothing yet: no micro-step has run since the last optimizer step.
  bool accumulated_ = false;
  bool first_micro_step_ = true;
  bool in_backward_ = false;
  // The order the model gathers units in, recorded by the first micro-step of its kind; later ones
  // prefetch along it. A forward-only pass (evaluation) gathers a prefix of training's order and stops:
  // it has an order of its own, so that neither prefetches what the other does not use.
  struct GatherOrder {
    std::vector<int> units;
    bool recorded = false;
  };
  GatherOrder training_order_, forward_only_order_;
  GatherOrder* order_ = &training_order_;  // the current micro-step's
  bool forward_only() const { return order_ == &forward_only_order_; }
  int64_t first_step_gathered_numel_ = 0;
  int64_t first_step_secondary_numel_ = 0;
  size_t gather_position_ = 0;
};

// ---- the inside that its four source files share (sharded_params.cpp: state and ownership;
// param_gather.cpp: all-gather and prefetch; grad_reduction.cpp: reduce-scatter and all-reduce;
// optimizer_step.cpp: norm and AdamW) ----

struct ShardedParams::Unit {
  Unit(const UnitSpec& spec, int group, int pad_multiple)
      : Unit(split_unit(spec), spec, group, pad_multiple) {}
  Unit(const UnitSplit& split, const UnitSpec& spec, int group, int pad_multiple)
      : layout(split.trainable, group, pad_multiple),
        frozen(split.frozen, group, pad_multiple),
        whole(spec, 1),
        slots(split.slots) {}
  FlatLayout layout;    // the trainable parameters: what gradients, AdamW and checkpoints cover
  FlatLayout frozen;    // the frozen parameters (shard/frozen_params.h): a compute copy, nothing else
  FlatLayout whole;     // every parameter in UnitSpec order, unsharded: how the model and weight files see it
  std::vector<ParamSlot> slots;  // each parameter's layout (trainable or frozen) and place there
  bool trainable() const { return layout.numel() > 0; }
  bool has_frozen() const { return frozen.numel() > 0; }
  // A gather not yet finished: a collective in flight, or records to dequantize (also after a group of
  // one's copy, which leaves no Work).
  bool gathering() const {
    return gather_work || frozen_gather_work || received.defined() || frozen_received.defined();
  }
  Tensor resident;      // compute copy: the full flat buffer when resident, this rank's shard when sharded
  Tensor frozen_resident;  // the same for the frozen parameters (undefined without any)
  Tensor master;        // the fp32 owned shard; a view into `resident` when the param dtype is fp32
  Tensor gathered;      // sharded params: the all-gathered full buffer while the unit is in use
  Tensor frozen_gathered;
  // Quantized gathers: this rank's shard of `resident` (and of `frozen_resident`) as the record a gather
  // sends, i32 words; undefined for a buffer without parameters.
  Tensor quantized, frozen_quantized;
  // Every chunk's blocks, on the device, for the quantized gathers of `layout` and of `frozen` (counted as
  // params and frozen, beside the records) and for the quantized reductions of `layout` (counted as
  // grads); empty where nothing is quantized.
  ChunkBlockTables gather_blocks, frozen_gather_blocks, reduction_blocks;
  Tensor received, frozen_received;  // every rank's records while the gather is in flight
  // Secondary groups: this rank's share of the gathered buffers, kept from the unit's release in forward
  // until the gather that makes it whole again (backward's, or a second use in forward).
  Tensor secondary, frozen_secondary;
  bool kept_secondary() const { return secondary.defined() || frozen_secondary.defined(); }
  comm::WorkPtr gather_work, frozen_gather_work;
  int gather_refs = 0;  // gathers not yet released, on every strategy (the protocol is checked on all)
  bool used = false;    // the model has gathered it since it was last freed (a prefetch is not yet used)
  // Where the unit's gradients are in this micro-step: the protocol allows grads() any number of times,
  // then one grads_ready().
  enum class Grads { untouched, requested, ready } grads_state = Grads::untouched;
  UnitTensors param_views;  // UnitSpec order, trainable and frozen
  Tensor grad_store;    // grads: full when resident (ddp, zero1), this rank's shard when sharded
  Tensor full_grads;    // what the model accumulates into: grad_store, or a transient full buffer
  UnitTensors grad_views;  // UnitSpec order; a frozen parameter's is undefined
  Tensor m, v;          // AdamW state of the owned shard
  std::vector<ops::ShardSegment> owned_segments;  // its parameters' pieces, in flat order: no padding
};

namespace sharded {
inline constexpr DType kF32 = DType::f32;

// Calls fn(T{}) with T the element type of `dtype` (float or bf16): where a runtime dtype picks an op's
// template argument.
template <class Fn>
decltype(auto) with_element_type(DType dtype, Fn&& fn) {
  if (dtype == DType::bf16) return fn(bf16{});
  ZS_CHECK(dtype == DType::f32, "parameters and gradients are f32 or bf16, not ", dtype_name(dtype));
  return fn(float{});
}

// A unit's views in UnitSpec order from its trainable and frozen layouts' views. Where one kind has no views
// its parameters' entries are undefined Tensors: a frozen parameter's gradient, and every gradient of a unit
// whose trainable parameters hold no element.
inline UnitTensors in_unit_order(const std::vector<ParamSlot>& slots, const UnitTensors& trainable,
                                 const UnitTensors& frozen) {
  UnitTensors out;
  for (const ParamSlot& s : slots) {
    const UnitTensors& views = s.frozen ? frozen : trainable;
    out.push_back(views.empty() ? Tensor() : views[size_t(s.index)]);
  }
  return out;
}

// This rank's shard of a unit buffer that holds either the full unit or that shard already.
inline Tensor owned_part(const FlatLayout& layout, int shard, const Tensor& buffer) {
  if (buffer.numel() != layout.padded_numel()) return buffer;
  return buffer.view(layout.shard_begin(shard), {layout.shard_numel()});
}

// dst += src, both on `device`; src is converted to dst's dtype first when they differ.
inline void accumulate(Device device, const Tensor& dst, Tensor src) {
  const size_t n = size_t(dst.numel());
  if (src.dtype() != dst.dtype()) {
    Tensor converted = Tensor::empty(dst.shape(), dst.dtype(), device, Category::comm);
    ops::convert(device, converted.raw(), dst.dtype(), src.raw(), src.dtype(), n);
    src = converted;
  }
  with_element_type(dst.dtype(), [&](auto t) {
    using T = decltype(t);
    ops::axpy(device, dst.data<T>(), src.data<T>(), 1.0f, n);
  });
}
}  // namespace sharded

}  // namespace zshard
