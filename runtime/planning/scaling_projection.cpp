#include "runtime/planning/scaling_projection.h"

#include <algorithm>
#include <array>

#include <zshard/error.h>

#include "shard/comm_volume.h"

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

namespace {

// The bytes of a projected step: one micro-step that gathers every parameter twice (forward, backward),
// in shard groups of `group` ranks, `replicas` of them under hybrid (ddp and zero3 span the world).
CommVolume step_volume(StrategyKind kind, int world, int group, int replicas, const ProjectionInput& in) {
  return comm_volume({.kind = kind,
                      .world = world,
                      .group = group,
                      .replicas = replicas,
                      .psi = in.params,
                      .gathered = 2 * in.params,
                      .param_bytes = in.elem_bytes,
                      .grad_bytes = in.elem_bytes});
}

// zero3's collectives inside a group of G, moving `bytes`: two all-gathers (forward, backward) and a
// reduce-scatter per unit.
double in_group_ms(const LinkProfile& link, int G, double bytes, int U) {
  return 3 * U * ring_ms(link, G, 1, bytes / (3 * U));
}

// The all-reduce of each unit's shard across R groups, moving `bytes`, cut into `pieces` collectives (one
// per piece of the common refinement it owns, unequal groups): each pays its latency hops.
double across_groups_ms(const LinkProfile& link, int R, double bytes, int U, int pieces) {
  if (R <= 1) return 0;
  return U * (ring_ms(link, R, 2, bytes / U) + (pieces - 1) * 2 * (R - 1) * link.alpha_us / 1e3);
}

ProjectedStep finish(ProjectedStep s, StrategyKind kind, int world, const ProjectionInput& in) {
  const int U = in.units;
  s.step_ms = s.compute_ms + s.comm_ms;
  s.step_overlap_ms = std::max(s.compute_ms, s.comm_ms) + s.comm_ms / (kind == StrategyKind::ddp ? U : 3 * U);
  const double t1 = in.compute_ms;  // one rank: no communication
  s.efficiency = in.weak ? t1 / s.step_ms : t1 / (world * s.step_ms);
  s.efficiency_overlap = in.weak ? t1 / s.step_overlap_ms : t1 / (world * s.step_overlap_ms);
  return s;
}

ProjectedStep flat_step(StrategyKind kind, int world, const LinkProfile& flat, const ProjectionInput& in) {
  ProjectedStep s;
  s.compute_ms = in.compute_ms * (in.weak ? 1.0 : 1.0 / world);
  const int U = in.units;
  const double bytes = step_volume(kind, world, world, 1, in).in_group();
  if (kind == StrategyKind::ddp) s.comm_ms = U * ring_ms(flat, world, 2, bytes / U);
  else if (kind == StrategyKind::zero3) s.comm_ms = in_group_ms(flat, world, bytes, U);
  else fail("project_step: only ddp, zero3 and hybrid are projected");
  return finish(s, kind, world, in);
}

}  // namespace

ProjectedStep project_step(StrategyKind kind, int world, const ProjectionInput& in) {
  const LinkProfile& flat = world <= in.node_size ? in.intra : in.inter;
  if (kind != StrategyKind::hybrid) return flat_step(kind, world, flat, in);
  // The zero3 volume inside a shard group (the tools' default group, within a node), then an all-reduce
  // of each shard across the N/G replicas, between nodes once the world spans several.
  ProjectedStep s;
  s.compute_ms = in.compute_ms * (in.weak ? 1.0 : 1.0 / world);
  const int G = default_shard_group(world, in.node_size);
  const CommVolume v = step_volume(kind, world, G, world / G, in);
  s.comm_ms = in_group_ms(in.intra, G, v.in_group(), in.units) +
              across_groups_ms(flat, world / G, v.across, in.units, 1);
  return finish(s, kind, world, in);
}

ProjectedStep project_step(StrategyKind kind, const ShardGroups& nodes, const ProjectionInput& in) {
  const int world = nodes.world_size();
  const LinkProfile& flat = nodes.count() > 1 ? in.inter : in.intra;
  if (kind != StrategyKind::hybrid) return flat_step(kind, world, flat, in);
  ProjectedStep s;
  s.compute_ms = in.compute_ms * (in.weak ? 1.0 : 1.0 / world);
  // Every rank waits for the slowest: the largest node's gathers and reduce-scatters (most hops, most
  // bytes), the smallest node's all-reduce (the largest shard, cut into the most pieces).
  const int largest = *std::max_element(nodes.sizes().begin(), nodes.sizes().end());
  const int smallest = *std::min_element(nodes.sizes().begin(), nodes.sizes().end());
  const int R = nodes.count();
  s.comm_ms = in_group_ms(in.intra, largest, step_volume(kind, world, largest, R, in).in_group(), in.units) +
              across_groups_ms(flat, R, step_volume(kind, world, smallest, R, in).across, in.units,
                               (largest + smallest - 1) / smallest);
  return finish(s, kind, world, in);
}

double amdahl_efficiency(double serial_fraction, int world) {
  return 1.0 / (serial_fraction + (1 - serial_fraction) / world) / world;
}

double karp_flatt(double speedup, int world) {
  if (world <= 1) return 0;
  return (1.0 / speedup - 1.0 / world) / (1.0 - 1.0 / world);
}

}  // namespace zshard
