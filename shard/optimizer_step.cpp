// After the micro-steps: the global gradient norm and AdamW on the owned shards.
#include "shard/sharded_params.h"

#include <cmath>
#include <span>

#include "comm/flight_recorder/recorder.h"
#include "shard/optimizer_offload.h"

namespace zshard {

using namespace sharded;

double ShardedParams::grad_norm() {
  // Every parameter's owned gradient segment (the padding is left out), summed in one call: on a device
  // that is one host wait per step rather than one per segment.
  double sum = 0;
  with_element_type(plan_.placement.param_dtype, [&](auto t) {
    using T = decltype(t);
    std::vector<std::span<const T>> parts;
    for (int i = 0; i < num_units(); ++i) {
      const FlatLayout& layout = units_[i]->layout;
      const T* g = owned_grads(i).data<T>();
      const int64_t base = layout.shard_begin(shard_index());
      for (const auto& seg : layout.shard_segments(shard_index()))
        parts.emplace_back(g + (seg.flat_begin - base), size_t(seg.count));
    }
    sum = ops::sum_squares<T>(plan_.placement.device, parts);
  });
  const comm::CollectiveLabel label(comm::trace::Purpose::grad_norm);
  return std::sqrt(comms_.sum_of_partition(sum));
}

void ShardedParams::optimizer_step(const ops::AdamWParams& hp) {
  // Unit i's AdamW: every parameter segment of its owned shard as a piece of work over its elements. On the
  // device, with bf16 parameters the kernel writes the owned part of the compute copy in the same pass
  // (with fp32 the master is that part). Offloaded, it runs on the host from the host copy of the
  // gradients, over which it writes the bf16 copy that goes back to the device.
  const auto pieces_of = [&](int i) {
    before_owned_change(i);  // called just before unit i's pieces run
    Unit& u = *units_[i];
    const Device device = offload_ ? Device::cpu : plan_.placement.device;
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
  discard_gradients();
  for (const auto& u : units_) quantize_shard(u->layout, u->gather_blocks, u->resident, u->quantized);
  gather_resident_params();
}

}  // namespace zshard
