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
  // A unit with frozen parameters only keeps its (padding-only) trainable buffer: nothing to gather there.
  u.gathered = Tensor::empty({u.layout.padded_numel()}, dtype, device, Category::comm);
  if (u.trainable() && !test_skips_gather(shard_index(), unit))
    u.gather_work = gather_shards(u.resident.raw(), u.gathered.raw(), u.layout.shard_numel(), dtype);
  UnitTensors frozen;
  if (u.has_frozen()) {
    u.frozen_gathered = Tensor::empty({u.frozen.padded_numel()}, dtype, device, Category::comm);
    u.frozen_gather_work =
        gather_shards(u.frozen_resident.raw(), u.frozen_gathered.raw(), u.frozen.shard_numel(), dtype);
    frozen = u.frozen.views(u.frozen_gathered);
  }
  u.param_views = in_unit_order(u.slots, u.layout.views(u.gathered), frozen);
}

void ShardedParams::finish_gather(Unit& u) {
  for (comm::WorkPtr* work : {&u.gather_work, &u.frozen_gather_work}) {
    if (*work) (*work)->wait();
    work->reset();
  }
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
  ZS_CHECK(unit >= 0 && unit < num_units(), "gather of unknown unit ", unit);
  Unit& u = *units_[unit];
  if (!order_->recorded) {
    order_->units.push_back(unit);
    // A unit still held (nested, or kept from forward for backward) costs no collective.
    if (!u.used && !forward_only()) first_step_gathered_numel_ += u.layout.numel() + u.frozen.numel();
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
  ZS_CHECK(unit >= 0 && unit < num_units(), "release of unknown unit ", unit);
  Unit& u = *units_[unit];
  ZS_CHECK(u.gather_refs > 0, "release of unit ", u.layout.spec().name, " that is not gathered");
  if (--u.gather_refs > 0 || !params_sharded_) return;
  // Without resharding after forward, the gathered unit waits for its backward.
  if (!plan_.reshard_after_forward && !in_backward_) return;
  free_gathered(u);
}

}  // namespace zshard
