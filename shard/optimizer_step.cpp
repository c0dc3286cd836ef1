// After the micro-steps: the global gradient norm and AdamW on the owned shards, queued on the device with
// nothing read back: the norm stays in device memory, where AdamW reads the clip factor.
#include "shard/sharded_params.h"

#include <span>

#include "comm/flight_recorder/recorder.h"
#include "kernels/device_memory.h"
#include "shard/optimizer_offload.h"

namespace zshard {

using namespace sharded;

void ShardedParams::grad_norm_squares(double* own, double* gathered, double* norm_squares) {
  const Device device = plan_.placement.device;
  memset_device(device, own, 0, sizeof(double));
  // Parameter by parameter and unit by unit, each part's sum added in order: the CPU's bits are those of
  // one sum over every segment of the step, whatever a launch covers.
  with_element_type(plan_.placement.param_dtype, [&](auto t) {
    using T = decltype(t);
    for (int i = 0; i < num_units(); ++i) {
      const T* g = owned_grads(i).data<T>();
      std::vector<std::span<const T>> parts;
      for (const ops::ShardSegment& s : units_[i]->owned_segments) parts.emplace_back(g + s.begin, s.count);
      ops::sum_squares<T>(device, own, parts);
    }
  });
  const comm::CollectiveLabel label(comm::trace::Purpose::grad_norm);
  comms_.sum_of_partition(device, own, gathered, norm_squares);
}

void ShardedParams::optimizer_step(const ops::StepScalars* step) {
  // AdamW over some segments of unit i's owned shard. On the device, with bf16 parameters the op writes
  // the owned part of the compute copy in the same pass (with fp32 the master is that part). Offloaded, it
  // runs on the host from the host copy of the gradients, over which it writes the bf16 copy that goes back
  // to the device.
  const Device device = offload_ ? Device::cpu : plan_.placement.device;
  const auto adamw = [&](int i, std::span<const ops::ShardSegment> segments) {
    Unit& u = *units_[i];
    const Tensor grads = offload_ ? offload_->host_grads(i) : owned_grads(i);
    bf16* copy = nullptr;
    if (u.resident.dtype() == DType::bf16) copy = (offload_ ? grads : owned_compute(u)).data<bf16>();
    with_element_type(grads.dtype(), [&](auto t) {
      using T = decltype(t);
      ops::adamw_step(device, u.master.data<float>(), grads.data<T>(), u.m.data<float>(), u.v.data<float>(),
                      segments, step, copy);
    });
  };
  if (offload_) {
    // On the host's cores, each unit's parameters uploaded behind it: every segment is a piece of work
    // that the threads cut among themselves.
    offload_->step([&](int i) {
      before_owned_change(i);  // called just before unit i's pieces run
      std::vector<AdamWPiece> pieces;
      for (const ops::ShardSegment& s : units_[i]->owned_segments)
        pieces.push_back({s.count, [&adamw, i, s](size_t begin, size_t count) {
                            const ops::ShardSegment piece{s.begin + begin, count, s.weight_decay};
                            adamw(i, std::span(&piece, 1));
                          }});
      return pieces;
    });
  } else {
    for (int i = 0; i < num_units(); ++i) {
      before_owned_change(i);
      adamw(i, units_[i]->owned_segments);  // one launch for the unit's whole shard
    }
  }
  discard_gradients();
  for (const auto& u : units_) quantize_shard(u->layout, u->gather_blocks, u->resident, u->quantized);
  gather_resident_params();
}

}  // namespace zshard
