#include "runtime/sharded_params.h"

#include <cmath>
#include <exception>

#include "kernels/device_memory.h"

namespace zshard {

struct ShardedParams::Unit {
  Unit(const UnitSpec& spec, int group) : layout(spec, group) {}
  FlatLayout layout;
  Tensor resident;      // params: the full flat buffer when resident, this rank's shard when sharded
  Tensor gathered;      // sharded params: the all-gathered full buffer while the unit is in use
  comm::WorkPtr gather_work;
  int gather_refs = 0;
  UnitTensors param_views;
  Tensor grad_store;    // grads: full when resident (ddp, zero1), this rank's shard when sharded
  Tensor full_grads;    // what the model accumulates into: grad_store, or a transient full buffer
  UnitTensors grad_views;
  Tensor m, v;          // AdamW state of the owned shard
};

namespace {
constexpr DType kF32 = DType::f32;

Tensor flat(int64_t n, Category category) { return Tensor::zeros({n}, kF32, Device::cpu, category); }
}  // namespace

ShardedParams::ShardedParams(const Model& model, comm::Communicator& world, const StrategyOptions& options,
                             uint64_t seed)
    : world_(world),
      options_(options),
      shard_group_size_(zshard::shard_group_size(options, world.size())),
      params_sharded_(zshard::params_sharded(options.kind)),
      grads_sharded_(zshard::grads_sharded(options.kind)) {
  ZS_CHECK(options.max_inflight >= 1, "--max-inflight must be >= 1, got ", options.max_inflight);
  groups_ = StrategyGroups::make(world, shard_group_size_);
  shard_index_ = groups_.shard->rank();
  const std::vector<UnitSpec> specs = model.units();
  for (size_t i = 0; i < specs.size(); ++i) {
    auto u = std::make_unique<Unit>(specs[i], shard_group_size_);
    const int64_t shard = u->layout.shard_numel(), padded = u->layout.padded_numel();
    u->resident = flat(params_sharded_ ? shard : padded, Category::params);
    u->grad_store = flat(grads_sharded_ ? shard : padded, Category::grads);
    u->m = flat(shard, Category::optimizer);
    u->v = flat(shard, Category::optimizer);
    if (!params_sharded_) u->param_views = u->layout.views(u->resident);
    if (!grads_sharded_) {
      u->full_grads = u->grad_store;
      u->grad_views = u->layout.views(u->full_grads);
    }
    units_.push_back(std::move(u));
    // Every rank initialises the whole unit from the seed and keeps its part, so the initial values do
    // not depend on the world size or strategy.
    Tensor full = flat(padded, Category::workspace);
    model.init_unit(int(i), units_.back()->layout.views(full), seed);
    set_unit_params(int(i), full.data<float>());
  }
}

ShardedParams::~ShardedParams() {
  // While unwinding from an error, peers may never match our collectives: waiting could hang, and the
  // job is about to be aborted anyway.
  if (std::uncaught_exceptions() > 0) return;
  for (auto& r : reductions_) if (r.work) r.work->wait();
  for (auto& u : units_) if (u->gather_work) u->gather_work->wait();
}

const FlatLayout& ShardedParams::layout(int unit) const { return units_[unit]->layout; }
Tensor ShardedParams::adam_m(int unit) const { return units_[unit]->m; }
Tensor ShardedParams::adam_v(int unit) const { return units_[unit]->v; }

Tensor ShardedParams::owned_params(int unit) const {
  const Unit& u = *units_[unit];
  if (params_sharded_) return u.resident;
  return u.resident.view(u.layout.shard_begin(shard_index_), {u.layout.shard_numel()});
}

Tensor ShardedParams::owned_grads(int unit) const {
  const Unit& u = *units_[unit];
  if (grads_sharded_) return u.grad_store;
  return u.grad_store.view(u.layout.shard_begin(shard_index_), {u.layout.shard_numel()});
}

void ShardedParams::set_unit_params(int unit, const float* full) {
  Unit& u = *units_[unit];
  const int64_t begin = params_sharded_ ? u.layout.shard_begin(shard_index_) : 0;
  copy_bytes(u.resident.raw(), Device::cpu, full + begin, Device::cpu, u.resident.nbytes());
}

std::vector<float> ShardedParams::full_unit_params(int unit) {
  Unit& u = *units_[unit];
  std::vector<float> out(u.layout.padded_numel());
  if (params_sharded_) {
    groups_.shard->all_gather(u.resident.raw(), out.data(), u.layout.shard_numel(), kF32)->wait();
  } else {
    copy_bytes(out.data(), Device::cpu, u.resident.raw(), Device::cpu, u.resident.nbytes());
  }
  return out;
}

void ShardedParams::sync_resident_params() {
  if (params_sharded_ || shard_group_size_ == 1) return;
  std::vector<comm::WorkPtr> works;
  for (auto& u : units_) {
    float* full = u->resident.data<float>();
    const int64_t shard = u->layout.shard_numel();
    works.push_back(groups_.shard->all_gather(full + u->layout.shard_begin(shard_index_), full, shard, kF32));
  }
  for (auto& w : works) w->wait();
}

// ---- gather / release ----

void ShardedParams::start_gather(Unit& u) {
  u.gathered = Tensor::empty({u.layout.padded_numel()}, kF32, Device::cpu, Category::comm);
  u.gather_work = groups_.shard->all_gather(u.resident.raw(), u.gathered.raw(), u.layout.shard_numel(), kF32);
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
}

int ShardedParams::inflight_units() const {
  int n = 0;
  for (const auto& u : units_) n += u->gathered.defined() ? 1 : 0;
  return n;
}

void ShardedParams::prefetch_after(size_t position) {
  if (position + 1 >= gather_order_.size()) return;
  Unit& next = *units_[gather_order_[position + 1]];
  if (!next.gathered.defined() && inflight_units() < options_.max_inflight) start_gather(next);
}

const UnitTensors& ShardedParams::gather(int unit) {
  ZS_CHECK(unit >= 0 && unit < num_units(), "gather of unknown unit ", unit);
  Unit& u = *units_[unit];
  if (!order_recorded_) gather_order_.push_back(unit);
  const size_t position = gather_position_++;
  if (params_sharded_) {
    if (u.gather_refs++ == 0 && !u.gathered.defined()) start_gather(u);
    if (u.gather_work) finish_gather(u);
    if (order_recorded_) prefetch_after(position);
  }
  poll_reductions();
  return u.param_views;
}

void ShardedParams::release(int unit) {
  if (!params_sharded_) return;
  Unit& u = *units_[unit];
  ZS_CHECK(u.gather_refs > 0, "release of unit ", u.layout.spec().name, " that is not gathered");
  if (--u.gather_refs > 0) return;
  // Without resharding after forward, the gathered unit waits for its backward.
  if (!options_.reshard_after_forward && !in_backward_) return;
  free_gathered(u);
}

// ---- gradients ----

const UnitTensors& ShardedParams::grads(int unit) {
  ZS_CHECK(unit >= 0 && unit < num_units(), "grads of unknown unit ", unit);
  in_backward_ = true;
  Unit& u = *units_[unit];
  if (!u.full_grads.defined()) {
    u.full_grads = flat(u.layout.padded_numel(), Category::comm);
    u.grad_views = u.layout.views(u.full_grads);
  }
  return u.grad_views;
}

void ShardedParams::grads_ready(int unit) {
  Unit& u = *units_[unit];
  ZS_CHECK(u.full_grads.defined(), "grads_ready for unit ", u.layout.spec().name, " without grads()");
  if (!sync_grads_ && !grads_sharded_) return;  // no_sync: keep accumulating locally
  Reduction r{unit, false, nullptr, Tensor()};
  const int64_t shard = u.layout.shard_numel();
  if (shard_group_size_ > 1) {
    r.scratch = Tensor::empty({shard}, kF32, Device::cpu, Category::comm);
    r.work = groups_.shard->reduce_scatter(u.full_grads.raw(), r.scratch.raw(), shard, kF32, comm::ReduceOp::sum);
  } else {
    r.scratch = u.full_grads;  // a group of one: the full buffer is the shard
  }
  reductions_.push_back(std::move(r));
  poll_reductions();
}

bool ShardedParams::advance(Reduction& r, bool blocking) {
  for (;;) {
    if (r.work) {
      if (blocking) {
        r.work->wait();
      } else if (!r.work->test()) {
        return false;
      }
      r.work.reset();
    }
    if (!r.reduce_scattered) {
      r.reduce_scattered = true;
      if (groups_.replica->size() > 1) {
        r.work = groups_.replica->all_reduce(r.scratch.raw(), r.scratch.numel(), kF32, comm::ReduceOp::sum);
        continue;
      }
    }
    break;
  }
  // The reduced shard lands in the owned gradients: added for sharded grads (they accumulate over
  // micro-steps), copied into the owned slice for zero1, already in place for ddp.
  Unit& u = *units_[r.unit];
  Tensor dest = owned_grads(r.unit);
  if (dest.raw() != r.scratch.raw()) {
    if (grads_sharded_) {
      cpu::axpy(dest.data<float>(), r.scratch.data<float>(), 1.0f, size_t(dest.numel()));
    } else {
      copy_bytes(dest.raw(), Device::cpu, r.scratch.raw(), Device::cpu, dest.nbytes());
    }
  }
  if (grads_sharded_) {
    u.full_grads = Tensor();
    u.grad_views.clear();
  }
  return true;
}

void ShardedParams::poll_reductions() {
  while (!reductions_.empty() && advance(reductions_.front(), false)) reductions_.pop_front();
  // Later reductions are tested too so that MPI progresses them while the model computes.
  for (auto& r : reductions_) if (r.work) r.work->test();
}

void ShardedParams::begin_micro_step(bool sync_grads) {
  sync_grads_ = sync_grads;
  in_backward_ = false;
  gather_position_ = 0;
}

void ShardedParams::end_micro_step() {
  while (!reductions_.empty()) {
    advance(reductions_.front(), true);
    reductions_.pop_front();
  }
  for (auto& u : units_) {
    ZS_CHECK(u->gather_refs == 0, "unit ", u->layout.spec().name, " still gathered at the end of a micro-step");
    if (u->gathered.defined()) free_gathered(*u);  // a prefetch the model did not use
    ZS_CHECK(!grads_sharded_ || !u->full_grads.defined(), "unit ", u->layout.spec().name,
             ": grads() without grads_ready() in this micro-step");
  }
  order_recorded_ = true;
}

// ---- optimizer ----

double ShardedParams::grad_norm() {
  double sum = 0;
  for (int i = 0; i < num_units(); ++i) {
    const FlatLayout& layout = units_[i]->layout;
    const float* g = owned_grads(i).data<float>();
    const int64_t base = layout.shard_begin(shard_index_);
    for (const auto& seg : layout.shard_segments(shard_index_))
      sum += cpu::sum_squares(g + (seg.flat_begin - base), size_t(seg.count));
  }
  // Replicas hold identical shards, so the shard group alone covers every element once.
  comm::all_reduce_sum(*groups_.shard, &sum, 1);
  return std::sqrt(sum);
}

void ShardedParams::optimizer_step(const cpu::AdamWParams& hp) {
  for (int i = 0; i < num_units(); ++i) {
    Unit& u = *units_[i];
    float* p = owned_params(i).data<float>();
    const float* g = owned_grads(i).data<float>();
    float* m = u.m.data<float>();
    float* v = u.v.data<float>();
    const int64_t base = u.layout.shard_begin(shard_index_);
    for (const auto& seg : u.layout.shard_segments(shard_index_)) {
      cpu::AdamWParams seg_hp = hp;
      if (!u.layout.spec().params[seg.param].weight_decay) seg_hp.weight_decay = 0;
      const int64_t off = seg.flat_begin - base;
      cpu::adamw_step(p + off, g + off, m + off, v + off, size_t(seg.count), seg_hp);
    }
    u.grad_store.zero_();
  }
  sync_resident_params();
}

comm::CommStats ShardedParams::comm_stats() const {
  comm::CommStats total;
  for (const comm::Communicator* c : {groups_.shard.get(), groups_.replica.get()}) {
    const comm::CommStats& s = c->stats();
    for (int k = 0; k < comm::kNumCollectives; ++k) {
      total.bytes[k] += s.bytes[k];
      total.calls[k] += s.calls[k];
    }
    total.seconds_waiting += s.seconds_waiting;
  }
  return total;
}

void ShardedParams::reset_comm_stats() {
  groups_.shard->reset_stats();
  groups_.replica->reset_stats();
}

}  // namespace zshard
