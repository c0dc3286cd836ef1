#include "runtime/sharded_params.h"

#include <cmath>
#include <exception>
#include <span>

#include "kernels/device_memory.h"
#include "kernels/ops.h"
#include "runtime/optimizer_offload.h"

namespace zshard {

struct ShardedParams::Unit {
  Unit(const UnitSpec& spec, int group, int pad_multiple) : layout(spec, group, pad_multiple) {}
  FlatLayout layout;
  Tensor resident;      // compute copy: the full flat buffer when resident, this rank's shard when sharded
  Tensor master;        // the fp32 owned shard; a view into `resident` when the param dtype is fp32
  Tensor gathered;      // sharded params: the all-gathered full buffer while the unit is in use
  comm::WorkPtr gather_work;
  int gather_refs = 0;  // gathers not yet released, on every strategy (the protocol is checked on all)
  bool used = false;    // the model has gathered it since it was last freed (a prefetch is not yet used)
  // Where the unit's gradients are in this micro-step: the protocol allows grads() any number of times,
  // then one grads_ready().
  enum class Grads { untouched, requested, ready } grads_state = Grads::untouched;
  UnitTensors param_views;
  Tensor grad_store;    // grads: full when resident (ddp, zero1), this rank's shard when sharded
  Tensor full_grads;    // what the model accumulates into: grad_store, or a transient full buffer
  UnitTensors grad_views;
  Tensor m, v;          // AdamW state of the owned shard
};

namespace {
constexpr DType kF32 = DType::f32;

// Calls fn(T{}) with T the element type of `dtype` (float or bf16): where a runtime dtype picks an op's
// template argument.
template <class Fn>
decltype(auto) with_element_type(DType dtype, Fn&& fn) {
  if (dtype == DType::bf16) return fn(bf16{});
  ZS_CHECK(dtype == DType::f32, "parameters and gradients are f32 or bf16, not ", dtype_name(dtype));
  return fn(float{});
}

// This rank's shard of a unit buffer that holds either the full unit or that shard already.
Tensor owned_part(const FlatLayout& layout, int shard, const Tensor& buffer) {
  if (buffer.numel() != layout.padded_numel()) return buffer;
  return buffer.view(layout.shard_begin(shard), {layout.shard_numel()});
}

// dst += src, both on `device`; src is converted to dst's dtype first when they differ.
void accumulate(Device device, const Tensor& dst, Tensor src) {
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
}  // namespace

ShardedParams::ShardedParams(const Model& model, comm::Communicator& comm, const StrategyOptions& options,
                             uint64_t seed, const Placement& placement)
    : options_(options),
      placement_(placement),
      comms_(comm, shard_groups(options, comm.size())),
      params_sharded_(zshard::params_sharded(options.kind)),
      grads_sharded_(zshard::grads_sharded(options.kind)) {
  ZS_CHECK(options.max_inflight >= 1, "--max-inflight must be >= 1, got ", options.max_inflight);
  for (DType t : {placement.param_dtype, placement.reduce_dtype})
    ZS_CHECK(t == kF32 || t == DType::bf16, "parameters are kept and reduced in f32 or bf16, not ",
             dtype_name(t));
  const Device device = placement.device;
  const DType compute = placement.param_dtype;
  const auto zeros = [&](int64_t n, DType dtype, Category category) {
    return Tensor::zeros({n}, dtype, device, category);
  };
  // Offloaded, the fp32 master and Adam m and v are host memory (page-locked on the CUDA path).
  const Category optimizer = placement.offload_optimizer ? Category::host : Category::optimizer;
  const Device optimizer_device = placement.offload_optimizer ? Device::cpu : device;
  const std::vector<UnitSpec> specs = model.units();
  for (size_t i = 0; i < specs.size(); ++i) {
    auto u = std::make_unique<Unit>(specs[i], shard_group_size(), comms_.groups().pad_multiple());
    const int64_t shard = u->layout.shard_numel(), padded = u->layout.padded_numel();
    u->resident = zeros(params_sharded_ ? shard : padded, compute, Category::params);
    const bool master_is_compute = compute == kF32 && !placement.offload_optimizer;
    const auto state = [&] { return Tensor::zeros({shard}, kF32, optimizer_device, optimizer); };
    u->master = master_is_compute ? owned_compute(*u) : state();
    u->grad_store = zeros(grads_sharded_ ? shard : padded, compute, Category::grads);
    u->m = state();
    u->v = state();
    if (!params_sharded_) u->param_views = u->layout.views(u->resident);
    if (!grads_sharded_) {
      u->full_grads = u->grad_store;
      u->grad_views = u->layout.views(u->full_grads);
    }
    units_.push_back(std::move(u));
    // Every rank initialises the whole unit from the seed, on the host, and keeps its part, so the
    // initial values do not depend on the world size, strategy or device.
    Tensor full = Tensor::zeros({padded}, kF32, Device::cpu, Category::workspace);
    model.init_unit(int(i), units_.back()->layout.views(full), seed);
    set_unit_params(int(i), full.data<float>());
  }
  if (placement.offload_optimizer) {
    std::vector<OptimizerOffload::UnitBuffers> buffers;
    for (int i = 0; i < num_units(); ++i)
      buffers.push_back({owned_grads(i), owned_compute(*units_[i]), units_[i]->master});
    offload_ = std::make_unique<OptimizerOffload>(device, std::move(buffers));
  }
  std::vector<int64_t> sizes = {0, 0};  // padded elements, two zeros for models of fewer units
  for (const auto& u : units_) sizes.push_back(u->layout.padded_numel());
  std::sort(sizes.rbegin(), sizes.rend());
  full_grads_budget_ = std::max(sizes[0], 2 * sizes[1]);
}

ShardedParams::~ShardedParams() {
  // While unwinding from an error, peers may never match our collectives: waiting could hang, and the
  // job is about to be aborted anyway. The same once any collective has failed.
  if (std::uncaught_exceptions() > 0 || comm::collectives_failed()) return;
  for (auto& r : reductions_) if (r.work) r.work->wait();
  for (auto& u : units_) if (u->gather_work) u->gather_work->wait();
}

const FlatLayout& ShardedParams::layout(int unit) const { return units_[unit]->layout; }
Tensor ShardedParams::adam_m(int unit) const { return units_[unit]->m; }
Tensor ShardedParams::adam_v(int unit) const { return units_[unit]->v; }

Tensor ShardedParams::owned_params(int unit) const { return units_[unit]->master; }

Tensor ShardedParams::owned_compute(const Unit& u) const {
  return owned_part(u.layout, shard_index(), u.resident);
}

Tensor ShardedParams::owned_grads(int unit) const {
  const Unit& u = *units_[unit];
  return owned_part(u.layout, shard_index(), u.grad_store);
}

void ShardedParams::set_unit_params(int unit, const float* full) {
  Unit& u = *units_[unit];
  const Device device = placement_.device;
  // The part of the unit this rank keeps, copied to the device in fp32: into the compute copy itself
  // when that is fp32, else into a staging buffer that the bf16 copy is made from; the master, where it
  // is a buffer of its own, takes its owned part.
  const int64_t begin = params_sharded_ ? u.layout.shard_begin(shard_index()) : 0, n = u.resident.numel();
  const Tensor staged =
      u.resident.dtype() == kF32 ? u.resident : Tensor::empty({n}, kF32, device, Category::workspace);
  copy_bytes(staged.raw(), device, full + begin, Device::cpu, staged.nbytes());
  if (staged.raw() != u.resident.raw())
    ops::convert(device, u.resident.raw(), u.resident.dtype(), staged.raw(), kF32, size_t(n));
  const Tensor owned = staged.view(u.layout.shard_begin(shard_index()) - begin, {u.layout.shard_numel()});
  if (owned.raw() != u.master.raw())
    copy_bytes(u.master.raw(), u.master.device(), owned.raw(), device, u.master.nbytes());
}

void ShardedParams::copy_master_to_compute(int unit) {
  if (offload_) return offload_->upload(unit);  // from host memory
  const Unit& u = *units_[unit];
  const Tensor compute = owned_compute(u);
  if (compute.raw() == u.master.raw()) return;
  if (compute.dtype() == kF32)
    copy_bytes(compute.raw(), placement_.device, u.master.raw(), placement_.device, compute.nbytes());
  else
    ops::convert(placement_.device, compute.raw(), compute.dtype(), u.master.raw(), kF32, size_t(compute.numel()));
}

std::vector<float> ShardedParams::full_unit_params(int unit) {
  Unit& u = *units_[unit];
  std::vector<float> out(u.layout.padded_numel());
  // Collectives on a device take device buffers: gather there, then copy to the host.
  Tensor staging;
  if (placement_.device != Device::cpu)
    staging = Tensor::empty({u.layout.padded_numel()}, kF32, placement_.device, Category::comm);
  void* dst = staging.defined() ? staging.raw() : out.data();
  Tensor send = u.master;
  if (send.device() != placement_.device) {  // offloaded to the host
    send = Tensor::empty(send.shape(), kF32, placement_.device, Category::comm);
    copy_bytes(send.raw(), placement_.device, u.master.raw(), u.master.device(), send.nbytes());
  }
  if (comm::WorkPtr work = gather_shards(send.raw(), dst, u.layout.shard_numel(), kF32)) work->wait();
  if (staging.defined()) copy_bytes(out.data(), Device::cpu, dst, placement_.device, staging.nbytes());
  return out;
}

void ShardedParams::sync_resident_params() {
  for (int i = 0; i < num_units(); ++i) copy_master_to_compute(i);
  gather_resident_params();
}

void ShardedParams::gather_resident_params() {
  if (params_sharded_ || shard_group_size() == 1) return;
  std::vector<comm::WorkPtr> works;
  for (auto& u : units_)
    works.push_back(gather_shards(owned_compute(*u).raw(), u->resident.raw(), u->layout.shard_numel(),
                                  u->resident.dtype()));
  for (auto& w : works) w->wait();
}

comm::WorkPtr ShardedParams::gather_shards(const void* send, void* recv, int64_t shard_numel, DType dtype) {
  if (shard_group_size() > 1) return comms_.shard().all_gather(send, recv, size_t(shard_numel), dtype);
  copy_bytes(recv, placement_.device, send, placement_.device, size_t(shard_numel) * dtype_size(dtype));
  return nullptr;
}

// ---- gather / release ----

void ShardedParams::start_gather(Unit& u) {
  u.gathered =
      Tensor::empty({u.layout.padded_numel()}, u.resident.dtype(), placement_.device, Category::comm);
  u.gather_work =
      gather_shards(u.resident.raw(), u.gathered.raw(), u.layout.shard_numel(), u.resident.dtype());
  u.param_views = u.layout.views(u.gathered);
}

void ShardedParams::finish_gather(Unit& u) {
  u.gather_work->wait();
  u.gather_work.reset();
}

void ShardedParams::free_gathered(Unit& u) {
  if (u.gather_work) finish_gather(u);
  u.gathered = Tensor();
  u.param_views.clear();
  u.used = false;
}

int ShardedParams::inflight_units() const {
  int n = 0;
  for (const auto& u : units_) n += u->gathered.defined() ? 1 : 0;
  return n;
}

void ShardedParams::prefetch_after(size_t position) {
  if (position + 1 >= order_->units.size()) return;
  Unit& next = *units_[order_->units[position + 1]];
  if (!next.gathered.defined() && inflight_units() < options_.max_inflight) start_gather(next);
}

const UnitTensors& ShardedParams::gather(int unit) {
  ZS_CHECK(unit >= 0 && unit < num_units(), "gather of unknown unit ", unit);
  Unit& u = *units_[unit];
  if (!order_->recorded) {
    order_->units.push_back(unit);
    // A unit still held (nested, or kept from forward for backward) costs no collective.
    if (!u.used && !forward_only()) first_step_gathered_numel_ += u.layout.numel();
  }
  u.used = true;
  const size_t position = gather_position_++;
  if (params_sharded_) {
    if (u.gather_refs == 0 && !u.gathered.defined()) start_gather(u);
    if (u.gather_work) finish_gather(u);
    if (order_->recorded) prefetch_after(position);
  }
  ++u.gather_refs;
  poll_reductions();
  return u.param_views;
}

void ShardedParams::release(int unit) {
  ZS_CHECK(unit >= 0 && unit < num_units(), "release of unknown unit ", unit);
  Unit& u = *units_[unit];
  ZS_CHECK(u.gather_refs > 0, "release of unit ", u.layout.spec().name, " that is not gathered");
  if (--u.gather_refs > 0 || !params_sharded_) return;
  // Without resharding after forward, the gathered unit waits for its backward.
  if (!options_.reshard_after_forward && !in_backward_) return;
  free_gathered(u);
}

// ---- gradients ----

const UnitTensors& ShardedParams::grads(int unit) {
  ZS_CHECK(unit >= 0 && unit < num_units(), "grads of unknown unit ", unit);
  Unit& u = *units_[unit];
  ZS_CHECK(!forward_only(), "grads() of unit ", u.layout.spec().name, " in a forward-only micro-step");
  in_backward_ = true;
  ZS_CHECK(u.grads_state != Unit::Grads::ready, "grads() of unit ", u.layout.spec().name,
           " after its grads_ready() in this micro-step");
  u.grads_state = Unit::Grads::requested;
  if (!u.full_grads.defined()) {
    fit_reductions_beside(u);
    u.full_grads =
        Tensor::zeros({u.layout.padded_numel()}, u.grad_store.dtype(), placement_.device, Category::comm);
    u.grad_views = u.layout.views(u.full_grads);
  }
  return u.grad_views;
}

void ShardedParams::grads_ready(int unit) {
  ZS_CHECK(unit >= 0 && unit < num_units(), "grads_ready of unknown unit ", unit);
  Unit& u = *units_[unit];
  // Checked before any collective: a second reduction of the same gradients would be silently wrong.
  ZS_CHECK(u.grads_state != Unit::Grads::ready, "grads_ready for unit ", u.layout.spec().name,
           " twice in one micro-step");
  ZS_CHECK(u.grads_state == Unit::Grads::requested, "grads_ready for unit ", u.layout.spec().name,
           " without grads()");
  u.grads_state = Unit::Grads::ready;
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
  Reduction r{unit, false, nullptr, u.full_grads, Tensor()};
  const Device device = placement_.device;
  const DType reduce = placement_.reduce_dtype;
  // With no collective at all (a world of one), a differing reduce dtype would only add two conversions.
  const bool communicates = shard_group_size() > 1 || comms_.across_groups();
  if (reduce != r.send.dtype() && communicates) {
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
    r.work = comms_.shard().reduce_scatter(r.send.raw(), r.scratch.raw(), shard, reduce, comm::ReduceOp::sum);
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
  // held to the same bound for its shard-sized scratch; ddp reduces in place, at no memory cost, and is
  // left to overlap freely.
  if (shard_group_size() > 1 || grads_sharded_)
    while (reductions_.size() > 1) finish_oldest_reduction();
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
  // The reduced shard lands in the owned gradients, converted when the reduce dtype differs: added for
  // sharded grads (they accumulate over micro-steps), copied into the owned slice for zero1, already in
  // place for ddp.
  Unit& u = *units_[r.unit];
  const Tensor dest = owned_grads(r.unit);
  if (dest.raw() != r.scratch.raw() && !r.lands_in_place) {
    if (grads_sharded_) {
      accumulate(placement_.device, dest, r.scratch);
    } else {
      ops::convert(placement_.device, dest.raw(), dest.dtype(), r.scratch.raw(), r.scratch.dtype(),
                   size_t(dest.numel()));
    }
  }
  if (grads_sharded_) {
    u.full_grads = Tensor();
    u.grad_views.clear();
  }
  if (offload_ && sync_grads_) offload_->grads_landed(r.unit);  // final for this step: off to the host
  return true;
}

void ShardedParams::poll_reductions() {
  while (!reductions_.empty() && advance(reductions_.front(), false)) reductions_.pop_front();
  // Later reductions are tested too so that MPI progresses them while the model computes.
  for (auto& r : reductions_) if (r.work) r.work->test();
}

void ShardedParams::begin_micro_step(bool sync_grads) {
  first_micro_step_ = !accumulated_;
  accumulated_ = true;
  sync_grads_ = sync_grads;
  in_backward_ = false;
  gather_position_ = 0;
  order_ = &training_order_;
}

void ShardedParams::begin_forward_only() {
  in_backward_ = false;
  gather_position_ = 0;
  order_ = &forward_only_order_;
}

void ShardedParams::end_micro_step() {
  // The protocol first, on every strategy: gradients never made ready would silently miss the reduction.
  for (auto& u : units_) {
    ZS_CHECK(u->gather_refs == 0, "unit ", u->layout.spec().name, " still gathered at the end of a micro-step");
    ZS_CHECK(u->grads_state != Unit::Grads::requested, "unit ", u->layout.spec().name,
             ": grads() without grads_ready() in this micro-step");
    u->grads_state = Unit::Grads::untouched;
  }
  while (!reductions_.empty()) finish_oldest_reduction();
  for (auto& u : units_)
    if (u->gathered.defined()) free_gathered(*u);  // a prefetch the model did not use
  order_->recorded = true;
}

// ---- optimizer ----

double ShardedParams::grad_norm() {
  // Every parameter's owned gradient segment (the padding is left out), summed in one call: on a device
  // that is one host wait per step rather than one per segment.
  double sum = 0;
  with_element_type(placement_.param_dtype, [&](auto t) {
    using T = decltype(t);
    std::vector<std::span<const T>> parts;
    for (int i = 0; i < num_units(); ++i) {
      const FlatLayout& layout = units_[i]->layout;
      const T* g = owned_grads(i).data<T>();
      const int64_t base = layout.shard_begin(shard_index());
      for (const auto& seg : layout.shard_segments(shard_index()))
        parts.emplace_back(g + (seg.flat_begin - base), size_t(seg.count));
    }
    sum = ops::sum_squares<T>(placement_.device, parts);
  });
  return std::sqrt(comms_.sum_of_partition(sum));
}

void ShardedParams::optimizer_step(const ops::AdamWParams& hp) {
  // Unit i's AdamW: every parameter segment of its owned shard as a piece of work over its elements. On the
  // device, with bf16 parameters the kernel writes the owned part of the compute copy in the same pass
  // (with fp32 the master is that part). Offloaded, it runs on the host from the host copy of the
  // gradients, over which it writes the bf16 copy that goes back to the device.
  const auto pieces_of = [&](int i) {
    Unit& u = *units_[i];
    const Device device = offload_ ? Device::cpu : placement_.device;
    const Tensor grads = offload_ ? offload_->host_grads(i) : owned_grads(i);
    bf16* copy = nullptr;
    if (u.resident.dtype() == DType::bf16) copy = (offload_ ? grads : owned_compute(u)).data<bf16>();
    float* p = u.master.data<float>();
    float* m = u.m.data<float>();
    float* v = u.v.data<float>();
    const int64_t base = u.layout.shard_begin(shard_index());
    std::vector<AdamWPiece> pieces;
    with_element_type(grads.dtype(), [&](auto t) {
      using T = decltype(t);
      const T* g = grads.data<T>();
      for (const auto& seg : u.layout.shard_segments(shard_index())) {
        ops::AdamWParams seg_hp = hp;
        if (!u.layout.spec().params[seg.param].weight_decay) seg_hp.weight_decay = 0;
        const int64_t off = seg.flat_begin - base;
        pieces.push_back({size_t(seg.count), [=](size_t begin, size_t count) {
                            const size_t at = size_t(off) + begin;
                            ops::adamw_step(device, p + at, g + at, m + at, v + at, count, seg_hp,
                                            copy ? copy + at : nullptr);
                          }});
      }
    });
    return pieces;
  };
  if (offload_) {
    offload_->step(pieces_of);  // on the host's cores, each unit's parameters uploaded behind it
  } else {
    for (int i = 0; i < num_units(); ++i)
      for (const AdamWPiece& piece : pieces_of(i)) piece.run(0, piece.n);  // a device launch per segment
  }
  for (auto& u : units_) u->grad_store.zero_();
  accumulated_ = false;
  gather_resident_params();
}

comm::CommStats ShardedParams::comm_stats() const { return comms_.stats(); }

void ShardedParams::reset_comm_stats() { comms_.reset_stats(); }

}  // namespace zshard
