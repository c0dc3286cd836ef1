#include "runtime/scaling_projection.h"

#include <algorithm>
#include <array>

#include "kernels/error.h"

namespace zshard {

namespace {

// Round figures of the links' achievable bus bandwidth and per-hop latency (nccl-tests on 8 GPUs).
const std::array<LinkProfile, 3> kProfiles = {{
    {"nvlink", 3.0, 300.0},  // NVLink 4 (H100 SXM), ~360 GB/s busbw peak all-reduce
    {"pcie", 8.0, 20.0},     // PCIe 4 x16 through the host
    {"ib", 10.0, 22.0},      // InfiniBand HDR 200 Gb/s per rank
}};

// One ring collective of `bytes` bus bytes in a group of n: hops * alpha + bytes / bandwidth.
double ring_ms(const LinkProfile& link, int n, int hops_per_rank, double bus_bytes) {
  if (n <= 1) return 0;
  return hops_per_rank * (n - 1) * link.alpha_us / 1e3 + bus_bytes / (link.bandwidth_gbs * 1e9) * 1e3;
}

}  // namespace

LinkProfile link_profile(const std::string& name) {
  for (const LinkProfile& p : kProfiles)
    if (p.name == name) return p;
  throw UsageError("--link: unknown profile '" + name + "' (nvlink, pcie, ib)");
}

std::vector<std::string> link_profile_names() {
  std::vector<std::string> names;
  for (const LinkProfile& p : kProfiles) names.push_back(p.name);
  return names;
}

ProjectedStep project_step(StrategyKind kind, int world, const ProjectionInput& in) {
  ProjectedStep s;
  const double share = in.weak ? 1.0 : 1.0 / world;
  s.compute_ms = in.compute_ms * share;
  const double bytes = double(in.params) * in.elem_bytes;
  const double frac = double(world - 1) / world;
  const int U = in.units;
  const LinkProfile& flat = world <= in.node_size ? in.intra : in.inter;
  switch (kind) {
    case StrategyKind::ddp: s.comm_ms = U * ring_ms(flat, world, 2, 2 * bytes * frac / U); break;
    case StrategyKind::zero3:
    case StrategyKind::hybrid: {
      // zero3: two all-gathers (forward, backward) and a reduce-scatter per unit, over the world.
      // hybrid: the same inside a shard group (the tools' default group, within a node), then an
      // all-reduce of each shard across the N/G replicas, between nodes once the world spans several.
      const int G = kind == StrategyKind::zero3 ? world : default_shard_group(world, in.node_size);
      const LinkProfile& group_link = kind == StrategyKind::zero3 ? flat : in.intra;
      const double gfrac = double(G - 1) / G;
      s.comm_ms = 3 * U * ring_ms(group_link, G, 1, bytes * gfrac / U);
      const int replicas = world / G;
      if (replicas > 1)
        s.comm_ms += U * ring_ms(flat, replicas, 2, 2 * bytes / G * double(replicas - 1) / replicas / U);
      break;
    }
    default: fail("project_step: only ddp, zero3 and hybrid are projected");
  }
  s.step_ms = s.compute_ms + s.comm_ms;
  s.step_overlap_ms = std::max(s.compute_ms, s.comm_ms) + s.comm_ms / (kind == StrategyKind::ddp ? U : 3 * U);
  const double t1 = in.compute_ms;  // one rank: no communication
  s.efficiency = in.weak ? t1 / s.step_ms : t1 / (world * s.step_ms);
  s.efficiency_overlap = in.weak ? t1 / s.step_overlap_ms : t1 / (world * s.step_overlap_ms);
  return s;
}

double amdahl_efficiency(double serial_fraction, int world) {
  return 1.0 / (serial_fraction + (1 - serial_fraction) / world) / world;
}

double karp_flatt(double speedup, int world) {
  if (world <= 1) return 0;
  return (1.0 / speedup - 1.0 / world) / (1.0 - 1.0 / world);
}

}  // namespace zshard
