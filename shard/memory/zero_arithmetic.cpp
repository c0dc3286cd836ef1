#include "shard/memory/zero_arithmetic.h"

#include <algorithm>
#include <functional>

#include "shard/comm_volume.h"
#include "shard/gather_quantization.h"

namespace zshard {

namespace {
// Bytes of `psi` elements of `bytes` each, cut into `parts` shards (rounded up like the flat units).
int64_t sharded_bytes(int64_t psi, int bytes, int parts) { return (psi + parts - 1) / parts * bytes; }
}  // namespace

int offloaded_bytes_per_param(const DtypePolicy& d, Device device) {
  const bool reads_owned_grads = device == Device::cpu && d.grad_bytes == 4;
  return kOffloadedOptimizerBytes + (reads_owned_grads ? 0 : d.grad_bytes);
}

ModelStateBytes predict_model_states(StrategyKind kind, int group, int64_t psi, const DtypePolicy& d,
                                     bool offload_optimizer, Device device, int64_t frozen_psi) {
  ModelStateBytes m;
  m.params = params_sharded(kind) ? sharded_bytes(psi, d.param_bytes, group) : psi * d.param_bytes;
  m.frozen = params_sharded(kind) ? sharded_bytes(frozen_psi, d.param_bytes, group) : frozen_psi * d.param_bytes;
  if (params_sharded(kind) && d.quantized_gathers) {
    // Without the units' layouts, the record of a shard in one piece (the estimator counts each unit's).
    const auto record = [&](int64_t n) {
      return int64_t(ops::quantized_size(size_t(sharded_bytes(n, 1, group)), kGatherQuantFormat).bytes());
    };
    m.params += record(psi);
    if (frozen_psi > 0) m.frozen += record(frozen_psi);
  }
  m.grads = grads_sharded(kind) ? sharded_bytes(psi, d.grad_bytes, group) : psi * d.grad_bytes;
  if (offload_optimizer) m.host = sharded_bytes(psi, offloaded_bytes_per_param(d, device), group);
  else m.optimizer = sharded_bytes(psi, d.optimizer_bytes, group);
  return m;
}

ModelStateBytes predict_zero_offload(StrategyKind kind, int group, int64_t psi, const DtypePolicy& d) {
  ModelStateBytes m = predict_model_states(kind, group, psi, d);
  m.grads = m.optimizer = 0;
  m.host = sharded_bytes(psi, kOffloadedOptimizerBytes + d.grad_bytes, group);
  return m;
}

int64_t predict_comm_bytes(StrategyKind kind, const ShardGroups& groups, int group, int64_t psi,
                           const GatherSchedule& gathers, int grad_accum, const DtypePolicy& d,
                           const QuantizedBytes& quantized) {
  const CommShape shape = {.kind = kind,
                           .world = groups.world_size(),
                           .group = group,
                           .replicas = groups.count(),
                           .psi = psi,
                           .gathered = gathers.gathered,
                           .grad_accum = grad_accum,
                           .param_bytes = d.param_bytes,
                           .grad_bytes = d.grad_bytes,
                           .quantized_gathers = d.quantized_gathers,
                           .quantized_reductions = d.quantized_reductions,
                           .quantized_bytes = quantized,
                           .secondary_gathered = gathers.secondary,
                           .secondary_group = gathers.secondary_group};
  return int64_t(comm_volume(shape).total());
}

int64_t sum_of_largest(std::vector<int64_t> sizes, int k) {
  std::sort(sizes.begin(), sizes.end(), std::greater<>());
  int64_t sum = 0;
  for (int i = 0; i < k && i < int(sizes.size()); ++i) sum += sizes[size_t(i)];
  return sum;
}

int64_t predict_gathered_bytes(const std::vector<int64_t>& unit_bytes, int max_inflight, bool reshard_after_forward) {
  if (!reshard_after_forward) return sum_of_largest(unit_bytes, int(unit_bytes.size()));
  return sum_of_largest(unit_bytes, std::max(1, max_inflight));
}

}  // namespace zshard
