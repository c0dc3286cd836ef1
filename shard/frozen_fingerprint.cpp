#include "shard/frozen_fingerprint.h"

#include <array>
#include <cstdio>

#include "kernels/device_memory.h"
#include "kernels/engine_ops.h"
#include "shard/sharded_params.h"

namespace zshard {

namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finaliser: every input bit moves every output bit
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

std::string frozen_fingerprint(const ShardedParams& params, comm::Communicator& world) {
  // A sum of per-element hashes does not depend on which rank holds which element. It is summed in four
  // 16-bit lanes, each exact in a double (below 2^53 for 2^37 elements), over every rank's owned shard:
  // every shard group covers each element once, so the world's sum is the groups' count times it.
  std::array<double, 4> lanes{};
  int64_t frozen = 0;
  for (int u = 0; u < params.num_units(); ++u) {
    const FlatLayout& layout = params.frozen_layout(u);
    frozen += layout.numel();
    const Tensor owned = params.owned_frozen(u);
    if (!owned.defined()) continue;
    const int64_t begin = layout.shard_begin(params.shard_index());
    std::vector<float> values(size_t(owned.numel()));
    Tensor f32 = owned;
    if (owned.dtype() != DType::f32) {
      f32 = Tensor::empty(owned.shape(), DType::f32, owned.device(), Category::workspace);
      ops::convert(owned.device(), f32.raw(), DType::f32, owned.raw(), owned.dtype(), values.size());
    }
    copy_bytes(values.data(), Device::cpu, f32.raw(), owned.device(), f32.nbytes());
    const int64_t real = std::min<int64_t>(owned.numel(), std::max<int64_t>(0, layout.numel() - begin));
    for (int64_t i = 0; i < real; ++i) {
      const uint64_t where = uint64_t(u) << 40 | uint64_t(begin + i);
      const uint64_t h = mix(mix(where) ^ bf16(values[size_t(i)]).bits);
      for (int lane = 0; lane < 4; ++lane) lanes[size_t(lane)] += double((h >> (16 * lane)) & 0xffff);
    }
  }
  if (frozen == 0) return "";
  comm::all_reduce_sum(world, lanes.data(), lanes.size());
  uint64_t hash = 0;
  for (double lane : lanes) hash = mix(hash ^ uint64_t(lane / params.groups().count()));
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

}  // namespace zshard
