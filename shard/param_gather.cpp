// The parameters' side of the protocol: all-gathers into transient buffers, the prefetch along the
// recorded order, and release.
#include "shard/sharded_params.h"

#include "comm/flight_recorder/recorder.h"
#include "kernels/device_memory.h"
#include "kernels/test_hooks.h"

namespace zshard {

using namespace sharded;

namespace {

// Whether ZSHARD_TEST_SKIP_GATHER skips this all-gather: the first one of its rank and unit in this process.
bool test_skips_gather(int shard_index, int unit) {
  const std::optional<TestHooks::SkipGather>& skip = test_hooks().skip_gather;
  static bool skipped = false;
  if (!skip || skipped || skip->rank != shard_index || skip->unit != unit) return false;
  return skipped = true;
}

}  // namespace

void ShardedParams::start_gather(int unit) {
  Unit& u = *units_[unit];
  const Device device = plan_.placement.device;
  const DType dtype = u.resident.dtype();
  const comm::CollectiveLabel label(comm::trace::Purpose::params, unit);
  const bool from_secondary = u.kept_secondary();
  // A gather from the secondary shares fills whole shares, which may reach past the padding.
  const auto gathered_numel = [&](const FlatLayout& l) {
    return from_secondary ? std::max(l.padded_numel(), l.share_numel(comms_.secondary()->size()) * comms_.secondary()->size())
                          : l.padded_numel();
  };
  // A unit with frozen parameters only has a padding-only trainable buffer: allocated (its definedness
  // marks the unit gathered) but not gathered.
  u.gathered = Tensor::empty({gathered_numel(u.layout)}, dtype, device, Category::comm);
  if (from_secondary && u.trainable())
    u.gather_work = gather_secondary_shares(u.layout, u.secondary, u.gathered);
  else if (u.trainable() && !test_skips_gather(shard_index(), unit))
    u.gather_work = start_buffer_gather(u.layout, u.resident, u.quantized, u.gathered, u.received);
  UnitTensors frozen;
  if (u.has_frozen()) {
    u.frozen_gathered = Tensor::empty({gathered_numel(u.frozen)}, dtype, device, Category::comm);
    u.frozen_gather_work =
        from_secondary
            ? gather_secondary_shares(u.frozen, u.frozen_secondary, u.frozen_gathered)
            : start_buffer_gather(u.frozen, u.frozen_resident, u.frozen_quantized, u.frozen_gathered, u.frozen_received);
    frozen = u.frozen.views(u.frozen_gathered.view(0, {u.frozen.padded_numel()}));
  }
  u.param_views = in_unit_order(u.slots, u.layout.views(u.gathered.view(0, {u.layout.padded_numel()})), frozen);
  // A secondary group of one copied its share in place: nothing to finish, and the unit is whole again.
  if (from_secondary && !u.gathering()) {
    u.secondary = Tensor();
    u.frozen_secondary = Tensor();
  }
}

Tensor ShardedParams::secondary_share(const FlatLayout& layout, const Tensor& gathered) {
  if (layout.numel() == 0) return Tensor();
  const Device device = plan_.placement.device;
  const int64_t n = layout.share_numel(comms_.secondary()->size()), begin = n * comms_.secondary()->rank();
  const int64_t have = std::clamp<int64_t>(layout.padded_numel() - begin, 0, n);
  // The tail past the unit's padding is never read as a parameter, but it crosses the wire: zeros.
  Tensor share = have < n ? Tensor::zeros({n}, gathered.dtype(), device, Category::comm)
                          : Tensor::empty({n}, gathered.dtype(), device, Category::comm);
  const size_t element = dtype_size(gathered.dtype());
  if (have > 0)
    copy_bytes(share.raw(), device, static_cast<const char*>(gathered.raw()) + size_t(begin) * element, device,
               size_t(have) * element);
  return share;
}

comm::WorkPtr ShardedParams::gather_secondary_shares(const FlatLayout& layout, const Tensor& share,
                                                     const Tensor& gathered) {
  comm::Communicator& group = *comms_.secondary();
  const int64_t n = layout.share_numel(group.size());
  if (group.size() > 1) return group.all_gather(share.raw(), gathered.raw(), size_t(n), share.dtype());
  copy_bytes(gathered.raw(), plan_.placement.device, share.raw(), plan_.placement.device, share.nbytes());
  return nullptr;
}

void ShardedParams::finish_gather(Unit& u) {
  for (comm::WorkPtr* work : {&u.gather_work, &u.frozen_gather_work}) {
    if (*work) (*work)->wait();
    work->reset();
  }
  dequantize_received(u.layout, u.gather_blocks, u.received, u.gathered);
  dequantize_received(u.frozen, u.frozen_gather_blocks, u.frozen_received, u.frozen_gathered);
  // The shares' all-gather has read them: the unit is whole again until its release.
  u.secondary = Tensor();
  u.frozen_secondary = Tensor();
}

void ShardedParams::quantize_shard(const FlatLayout& layout, const ChunkBlockTables& blocks, const Tensor& resident,
                                  const Tensor& quantized) {
  if (!quantized.defined()) return;
  const ops::QuantizedSize& size = blocks.record();
  auto* record = static_cast<int8_t*>(quantized.raw());
  with_element_type(resident.dtype(), [&](auto t) {
    using T = decltype(t);
    ops::quantize_blocks(plan_.placement.device, record, reinterpret_cast<float*>(record + size.scales_offset()),
                         owned_part(layout, shard_index(), resident).template data<T>(), size_t(layout.shard_numel()),
                         blocks.format(), blocks.chunk(shard_index()));
  });
}

comm::WorkPtr ShardedParams::start_buffer_gather(const FlatLayout& layout, const Tensor& resident,
                                                 const Tensor& quantized, const Tensor& gathered, Tensor& received) {
  if (!quantized.defined()) return gather_shards(resident.raw(), gathered.raw(), layout.shard_numel(), resident.dtype());
  received = Tensor::empty({shard_group_size() * quantized.numel()}, DType::i32, plan_.placement.device, Category::comm);
  return gather_shards(quantized.raw(), received.raw(), quantized.numel(), DType::i32);
}

void ShardedParams::dequantize_received(const FlatLayout& layout, const ChunkBlockTables& blocks, Tensor& received,
                                       const Tensor& gathered) {
  if (!received.defined()) return;
  const size_t shard = size_t(layout.shard_numel());
  const ops::QuantizedSize& size = blocks.record();
  with_element_type(gathered.dtype(), [&](auto t) {
    using T = decltype(t);
    for (int r = 0; r < shard_group_size(); ++r) {
      const int8_t* record = static_cast<const int8_t*>(received.raw()) + size_t(r) * size.bytes();
      ops::dequantize_blocks(plan_.placement.device, gathered.data<T>() + size_t(r) * shard, record,
                             reinterpret_cast<const float*>(record + size.scales_offset()), shard, blocks.format(),
                             blocks.chunk(r), false);
    }
  });
  received = Tensor();
}

void ShardedParams::free_gathered(Unit& u) {
  if (u.gathering()) finish_gather(u);
  u.gathered = Tensor();
  u.frozen_gathered = Tensor();
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
  if (!next.gathered.defined() && inflight_units() < plan_.max_inflight) start_gather(order_->units[position + 1]);
}

const UnitTensors& ShardedParams::gather(int unit) {
  if (unit < 0 || unit >= num_units()) fail("gather of unknown unit ", unit);
  Unit& u = *units_[unit];
  if (!order_->recorded) {
    order_->units.push_back(unit);
    // A unit still held (nested, or kept from forward for backward) costs no collective.
    if (!u.used && !forward_only()) {
      first_step_gathered_numel_ += u.layout.numel() + u.frozen.numel();
      if (u.kept_secondary()) first_step_secondary_numel_ += u.layout.numel() + u.frozen.numel();
    }
  }
  u.used = true;
  const size_t position = gather_position_++;
  if (params_sharded_) {
    if (u.gather_refs == 0 && !u.gathered.defined()) start_gather(unit);
    if (u.gathering()) finish_gather(u);
    if (order_->recorded) prefetch_after(position);
  }
  ++u.gather_refs;
  poll_reductions();
  return u.param_views;
}

void ShardedParams::release(int unit) {
  if (unit < 0 || unit >= num_units()) fail("release of unknown unit ", unit);
  Unit& u = *units_[unit];
  if (u.gather_refs <= 0) fail("release of unit ", u.layout.spec().name, " that is not gathered");
  if (--u.gather_refs > 0 || !params_sharded_) return;
  // Without resharding after forward, the gathered unit waits for its backward.
  if (!plan_.reshard_after_forward && !in_backward_) return;
  // With secondary groups, this rank's share of it waits instead: backward gathers inside the group.
  if (comms_.secondary() && !in_backward_ && !forward_only()) {
    if (u.gathering()) finish_gather(u);
    u.secondary = secondary_share(u.layout, u.gathered);
    u.frozen_secondary = secondary_share(u.frozen, u.frozen_gathered);
  }
  free_gathered(u);
}

}  // namespace zshard
