#include "shard/frozen_fingerprint.h"

#include <algorithm>
#include <array>
#include <cstdio>

#include "comm/agreed_failure.h"
#include "kernels/allocator.h"
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
  const int64_t frozen = params.frozen_numel();
  if (frozen == 0) return "";
  // A sum of per-element hashes does not depend on which rank holds which element. The first shard group
  // covers each element once (the others are its replicas and add nothing); its ranks sum their owned
  // shards in four 16-bit lanes, each exact in a double below 2^37 elements. Values in bf16 are widened a
  // chunk at a time and a device's come to the host a chunk at a time; fp32 on the host is read in place. So
  // a rank holding the whole frozen model needs no second copy of it.
  constexpr int64_t kChunk = int64_t(1) << 24;
  std::array<double, 4> lanes{};
  run_agreed(world, [&] {
    if (params.groups().group_of(world.rank()) != 0) return;
    for (int u = 0; u < params.num_units(); ++u) {
      const Tensor owned = params.owned_frozen(u);
      if (!owned.defined()) continue;
      const FlatLayout& layout = params.frozen_layout(u);
      const int64_t begin = layout.shard_begin(params.shard_index());
      const int64_t real = std::min<int64_t>(owned.numel(), std::max<int64_t>(0, layout.numel() - begin));
      const int64_t chunk = std::min(kChunk, std::max<int64_t>(real, 1));
      const bool on_host = owned.device() == Device::cpu;
      TrackedFloats copied(on_host ? 0 : size_t(chunk));
      const Tensor staging = owned.dtype() == DType::f32
                                 ? Tensor()
                                 : Tensor::empty({chunk}, DType::f32, owned.device(), Category::workspace);
      for (int64_t at = 0; at < real; at += chunk) {
        const int64_t n = std::min(chunk, real - at);
        const Tensor part = owned.view(at, {n});
        const void* f32 = part.raw();
        if (staging.defined()) {
          ops::convert(owned.device(), staging.raw(), DType::f32, part.raw(), owned.dtype(), size_t(n));
          f32 = staging.raw();
        }
        if (!on_host) {
          copy_bytes(copied.data(), Device::cpu, f32, owned.device(), size_t(n) * sizeof(float));
          f32 = copied.data();
        }
        const float* values = static_cast<const float*>(f32);
        for (int64_t i = 0; i < n; ++i) {
          const uint64_t where = uint64_t(u) << 40 | uint64_t(begin + at + i);
          const uint64_t h = mix(mix(where) ^ bf16(values[i]).bits);
          for (int lane = 0; lane < 4; ++lane) lanes[size_t(lane)] += double((h >> (16 * lane)) & 0xffff);
        }
      }
    }
  });
  comm::all_reduce_sum(world, lanes.data(), lanes.size());
  uint64_t hash = 0;
  for (double lane : lanes) hash = mix(hash ^ uint64_t(lane));
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

}  // namespace zshard
