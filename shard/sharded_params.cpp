#include "shard/sharded_params.h"

#include <algorithm>
#include <exception>

#include "comm/backend_base.h"
#include "comm/flight_recorder/recorder.h"
#include "kernels/device_memory.h"
#include "shard/gather_quantization.h"
#include "shard/optimizer_offload.h"
#include "shard/reduction_quantization.h"
#include "shard/unit_specs.h"

namespace zshard {

using namespace sharded;

ShardedParams::ShardedParams(const Model& model, comm::Communicator& comm, const ShardPlan& plan, uint64_t seed,
                             const std::vector<std::string>& freeze)
    : plan_(plan),
      comms_(comm, plan.groups, plan.secondary_groups),
      params_sharded_(plan.params_sharded()),
      grads_sharded_(plan.grads_sharded()),
      quantized_gathers_(plan.quantize_gathers == GatherQuantization::int8) {
  ZS_CHECK(comm.size() == plan.world_size(), "a plan for ", plan.world_size(), " ranks on a world of ", comm.size());
  ZS_CHECK(plan.max_inflight >= 1, "max_inflight must be >= 1, got ", plan.max_inflight);
  ZS_CHECK(params_sharded_ || !quantized_gathers_, "quantized gathers on ", strategy_name(plan.kind),
           ", which gathers no parameters");
  ZS_CHECK(plan.kind != StrategyKind::ddp || plan.quantize_reductions == ReductionQuantization::none,
           "quantized reductions on ddp, which reduce-scatters nothing");
  ZS_CHECK(!plan.secondary_groups || (plan.kind == StrategyKind::zero3 && plan.reshard_after_forward),
           "secondary groups on ", strategy_name(plan.kind),
           plan.reshard_after_forward ? "" : " without resharding after forward", ": they are zero3's, resharding");
  const Placement& placement = plan.placement;
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
  std::vector<UnitSpec> specs = model.units();
  check_unit_specs(specs);
  specs = freeze_matching(std::move(specs), freeze);
  for (size_t i = 0; i < specs.size(); ++i) {
    auto u = std::make_unique<Unit>(specs[i], shard_group_size(), comms_.groups().pad_multiple());
    const int64_t shard = u->layout.shard_numel(), padded = u->layout.padded_numel();
    u->resident = zeros(params_sharded_ ? shard : padded, compute, Category::params);
    if (u->has_frozen())
      u->frozen_resident =
          zeros(params_sharded_ ? u->frozen.shard_numel() : u->frozen.padded_numel(), compute, Category::frozen);
    if (quantized_gathers_) {
      const auto record = [&](const FlatLayout& l, ChunkBlockTables& blocks, Category c) {
        blocks = ChunkBlockTables(l, kGatherQuantFormat, device, c);
        return zeros(int64_t(blocks.record().bytes() / sizeof(int32_t)), DType::i32, c);
      };
      if (u->trainable()) u->quantized = record(u->layout, u->gather_blocks, Category::params);
      if (u->has_frozen()) u->frozen_quantized = record(u->frozen, u->frozen_gather_blocks, Category::frozen);
    }
    if (plan.quantize_reductions != ReductionQuantization::none && shard_group_size() > 1 && u->trainable())
      u->reduction_blocks =
          ChunkBlockTables(u->layout, reduction_quant_format(plan.quantize_reductions), device, Category::grads);
    const bool master_is_compute = compute == kF32 && !placement.offload_optimizer;
    const auto state = [&] { return Tensor::zeros({shard}, kF32, optimizer_device, optimizer); };
    u->master = master_is_compute ? owned_compute(*u) : state();
    u->grad_store = zeros(grads_sharded_ ? shard : padded, compute, Category::grads);
    u->m = state();
    u->v = state();
    // What AdamW and the norm cover of the owned shard, each parameter's piece with its weight decay.
    const int64_t base = u->layout.shard_begin(shard_index());
    for (const FlatSegment& seg : u->layout.shard_segments(shard_index()))
      u->owned_segments.push_back({size_t(seg.flat_begin - base), size_t(seg.count),
                                   u->layout.spec().params[size_t(seg.param)].weight_decay});
    if (!params_sharded_)
      u->param_views = in_unit_order(u->slots, u->layout.views(u->resident),
                                     u->has_frozen() ? u->frozen.views(u->frozen_resident) : UnitTensors{});
    if (!grads_sharded_) {
      u->full_grads = u->grad_store;
      u->grad_views = in_unit_order(u->slots, u->layout.views(u->full_grads), {});
    }
    units_.push_back(std::move(u));
    // Every rank initialises the whole unit from the seed, on the host, and keeps its part, so the
    // initial values do not depend on the world size, strategy, device or what is frozen.
    // The model writes each parameter where its flat buffer keeps it, so that set-up holds a unit's values
    // once on the host, not in a copy of the unit in its own order beside them: in the buffer itself where
    // it holds the whole unit in fp32 on the host, else in a staging of the whole unit, uploaded once.
    const Unit& made = *units_.back();
    const bool any_frozen = !made.frozen.spec().params.empty();  // of any size: has_frozen() needs elements
    const bool in_place = !params_sharded_ && compute == kF32 && device == Device::cpu;
    const auto values_of = [&](const FlatLayout& layout, const Tensor& resident) {
      return in_place && resident.defined() ? resident
                                            : Tensor::zeros({layout.padded_numel()}, kF32, Device::cpu, Category::workspace);
    };
    const Tensor trainable = values_of(made.layout, made.resident);
    const Tensor frozen = any_frozen ? values_of(made.frozen, made.frozen_resident) : Tensor();
    model.init_unit(int(i),
                    in_unit_order(made.slots, made.layout.views(trainable),
                                  any_frozen ? made.frozen.views(frozen) : UnitTensors{}),
                    seed);
    set_unit_params(int(i), trainable.data<float>());
    if (any_frozen) set_frozen_params(int(i), frozen.data<float>());
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
  loss_sum_ = Tensor::zeros({1}, DType::f64, device, Category::workspace);
  loss_target_ = loss_sum_.data<double>();
}

double ShardedParams::take_loss_sum() {
  double sum = 0;
  ops::read_back(plan_.placement.device, &sum, loss_sum_.raw(), sizeof sum);
  loss_sum_.zero_();
  return sum;
}

ShardedParams::~ShardedParams() {
  // While unwinding from an error, peers may never match our collectives: waiting could hang, and the
  // job is about to be aborted anyway. The same once any collective has failed.
  if (std::uncaught_exceptions() > 0 || comm::collectives_failed()) return;
  for (auto& r : reductions_) if (r.work) r.work->wait();
  for (auto& u : units_)
    for (comm::WorkPtr* work : {&u->gather_work, &u->frozen_gather_work})
      if (*work) (*work)->wait();
}

const FlatLayout& ShardedParams::layout(int unit) const { return units_[unit]->layout; }
const FlatLayout& ShardedParams::frozen_layout(int unit) const { return units_[unit]->frozen; }

int64_t ShardedParams::frozen_numel() const {
  int64_t numel = 0;
  for (const auto& u : units_) numel += u->frozen.numel();
  return numel;
}

std::vector<UnitSpec> ShardedParams::trainable_units() const {
  std::vector<UnitSpec> out;
  for (const auto& u : units_) out.push_back(u->layout.spec());
  return out;
}
Tensor ShardedParams::adam_m(int unit) const { return units_[unit]->m; }
Tensor ShardedParams::adam_v(int unit) const { return units_[unit]->v; }

Tensor ShardedParams::owned_params(int unit) const { return units_[unit]->master; }

Tensor ShardedParams::owned_frozen(int unit) const {
  const Unit& u = *units_[unit];
  return u.has_frozen() ? owned_part(u.frozen, shard_index(), u.frozen_resident) : Tensor();
}

Tensor ShardedParams::owned_compute(const Unit& u) const {
  return owned_part(u.layout, shard_index(), u.resident);
}

Tensor ShardedParams::owned_grads(int unit) const {
  const Unit& u = *units_[unit];
  return owned_part(u.layout, shard_index(), u.grad_store);
}

void ShardedParams::upload(const FlatLayout& layout, const Tensor& resident, const float* full) {
  const Device device = plan_.placement.device;
  const int64_t begin = params_sharded_ ? layout.shard_begin(shard_index()) : 0, n = resident.numel();
  if (resident.dtype() == kF32) {
    if (resident.raw() == full + begin) return;  // set-up wrote the values in place
    return copy_bytes(resident.raw(), device, full + begin, Device::cpu, resident.nbytes());
  }
  if (device == Device::cpu) return ops::convert(device, resident.raw(), resident.dtype(), full + begin, kF32, size_t(n));
  // A GPU converts its own memory: the fp32 values go there first.
  const Tensor staged = Tensor::empty({n}, kF32, device, Category::workspace);
  copy_bytes(staged.raw(), device, full + begin, Device::cpu, staged.nbytes());
  ops::convert(device, resident.raw(), resident.dtype(), staged.raw(), kF32, size_t(n));
}

void ShardedParams::set_unit_params(int unit, const float* full) {
  before_owned_change(unit);
  Unit& u = *units_[unit];
  upload(u.layout, u.resident, full);
  // The master, where it is a buffer of its own, takes its owned part.
  if (u.master.raw() != owned_compute(u).raw())
    copy_bytes(u.master.raw(), u.master.device(), full + u.layout.shard_begin(shard_index()), Device::cpu,
               u.master.nbytes());
  quantize_shard(u.layout, u.gather_blocks, u.resident, u.quantized);
}

void ShardedParams::set_frozen_params(int unit, const float* full) {
  Unit& u = *units_[unit];
  if (!u.has_frozen()) return;
  upload(u.frozen, u.frozen_resident, full);
  quantize_shard(u.frozen, u.frozen_gather_blocks, u.frozen_resident, u.frozen_quantized);
}

void ShardedParams::copy_master_to_compute(int unit) {
  if (offload_) return offload_->upload(unit);  // from host memory
  const Unit& u = *units_[unit];
  const Tensor compute = owned_compute(u);
  if (compute.raw() == u.master.raw()) return;
  if (compute.dtype() == kF32)
    copy_bytes(compute.raw(), plan_.placement.device, u.master.raw(), plan_.placement.device, compute.nbytes());
  else
    ops::convert(plan_.placement.device, compute.raw(), compute.dtype(), u.master.raw(), kF32, size_t(compute.numel()));
}

FlatValues ShardedParams::full_unit_params(int unit) {
  Unit& u = *units_[unit];
  FlatValues out(size_t(u.layout.padded_numel()));
  // Collectives on a device take device buffers: gather there, then copy to the host.
  Tensor staging;
  if (plan_.placement.device != Device::cpu)
    staging = Tensor::empty({u.layout.padded_numel()}, kF32, plan_.placement.device, Category::comm);
  void* dst = staging.defined() ? staging.raw() : out.data();
  Tensor send = u.master;
  if (send.device() != plan_.placement.device) {  // offloaded to the host
    send = Tensor::empty(send.shape(), kF32, plan_.placement.device, Category::comm);
    copy_bytes(send.raw(), plan_.placement.device, u.master.raw(), u.master.device(), send.nbytes());
  }
  const comm::CollectiveLabel label(comm::trace::Purpose::params, unit);
  if (comm::WorkPtr work = gather_shards(send.raw(), dst, u.layout.shard_numel(), kF32)) work->wait();
  if (staging.defined()) copy_bytes(out.data(), Device::cpu, dst, plan_.placement.device, staging.nbytes());
  return out;
}

FlatValues ShardedParams::full_frozen_params(int unit) {
  const Unit& u = *units_[unit];
  FlatValues out(size_t(u.frozen.padded_numel()));
  if (!u.has_frozen()) return out;
  const Device device = plan_.placement.device;
  Tensor full = u.frozen_resident;
  if (params_sharded_) {
    full = Tensor::empty({u.frozen.padded_numel()}, full.dtype(), device, Category::comm);
    const comm::CollectiveLabel label(comm::trace::Purpose::params, unit);
    if (comm::WorkPtr work = gather_shards(u.frozen_resident.raw(), full.raw(), u.frozen.shard_numel(), full.dtype()))
      work->wait();
  }
  if (full.dtype() != kF32) {
    Tensor f32 = Tensor::empty(full.shape(), kF32, device, Category::comm);
    ops::convert(device, f32.raw(), kF32, full.raw(), full.dtype(), size_t(full.numel()));
    full = f32;
  }
  copy_bytes(out.data(), Device::cpu, full.raw(), device, full.nbytes());
  return out;
}

FlatValues ShardedParams::whole_unit_params(int unit) {
  const Unit& u = *units_[unit];
  FlatValues trainable = full_unit_params(unit);
  // Without frozen parameters the trainable buffer is the unit in UnitSpec order already, its padding apart.
  if (!u.has_frozen()) {
    trainable.resize(size_t(u.whole.padded_numel()));
    return trainable;
  }
  const FlatValues frozen = full_frozen_params(unit);
  FlatValues out(size_t(u.whole.padded_numel()));
  for (size_t p = 0; p < u.slots.size(); ++p) {
    const ParamSlot& slot = u.slots[p];
    const float* from = (slot.frozen ? frozen : trainable).data() + (slot.frozen ? u.frozen : u.layout).offset(slot.index);
    std::copy_n(from, u.whole.spec().params[p].numel(), out.data() + u.whole.offset(int(p)));
  }
  return out;
}

void ShardedParams::sync_resident_params() {
  for (int i = 0; i < num_units(); ++i) {
    copy_master_to_compute(i);
    quantize_shard(units_[i]->layout, units_[i]->gather_blocks, units_[i]->resident, units_[i]->quantized);
  }
  gather_resident_params();
}

void ShardedParams::gather_resident_params() {
  if (params_sharded_ || shard_group_size() == 1) return;
  std::vector<comm::WorkPtr> works;
  for (int i = 0; i < num_units(); ++i) {
    const Unit& u = *units_[i];
    if (!u.trainable()) continue;  // frozen parameters only: nothing the optimizer changed
    const comm::CollectiveLabel label(comm::trace::Purpose::params, i);
    works.push_back(gather_shards(owned_compute(u).raw(), u.resident.raw(), u.layout.shard_numel(), u.resident.dtype()));
  }
  for (auto& w : works) w->wait();
}

comm::WorkPtr ShardedParams::gather_shards(const void* send, void* recv, int64_t shard_numel, DType dtype) {
  if (shard_group_size() > 1) return comms_.shard().all_gather(send, recv, size_t(shard_numel), dtype);
  copy_bytes(recv, plan_.placement.device, send, plan_.placement.device, size_t(shard_numel) * dtype_size(dtype));
  return nullptr;
}

comm::CommStats ShardedParams::comm_stats() const { return comms_.stats(); }

void ShardedParams::reset_comm_stats() { comms_.reset_stats(); }

}  // namespace zshard
