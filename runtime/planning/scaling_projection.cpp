#include "runtime/planning/scaling_projection.h"

#include <algorithm>
#include <array>
#include <cmath>

#include <zshard/error.h>

#include "shard/comm_volume.h"
#include "shard/plan_internals.h"

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

StrategyOptions projected_strategy(StrategyKind kind, const ProjectionInput& in) {
  StrategyOptions asked;
  asked.quantize_gathers = in.quantize_gathers;
  asked.quantize_reductions = in.quantize_reductions;
  if (in.secondary_per_node) asked.secondary_shard.kind = SecondaryShard::Kind::host;
  return strategy_options_for(kind, asked);
}

namespace {

// The bytes of a projected step: grad_accum micro-steps, each gathering every parameter twice (forward,
// backward) and, sharded, reducing the gradients of the trainable ones (ddp reduces once, at the step's end), in shard groups of `group` ranks, `replicas` of them
// under hybrid (ddp and zero3 span the world);
// backward's gathers inside secondary groups of `secondary_group` ranks where there are any (> 1).
CommVolume step_volume(StrategyKind kind, int world, int group, int replicas, int secondary_group,
                       const ProjectionInput& in) {
  const bool secondary = secondary_group > 1;
  const StrategyOptions s = projected_strategy(kind, in);
  return comm_volume({.kind = kind,
                      .world = world,
                      .group = group,
                      .replicas = replicas,
                      .psi = in.params - in.frozen_params,
                      .gathered = 2 * in.params,
                      .grad_accum = in.grad_accum,
                      .param_bytes = in.elem_bytes,
                      .grad_bytes = in.elem_bytes,
                      .quantized_gathers = s.quantize_gathers == GatherQuantization::int8,
                      .quantized_reductions = s.quantize_reductions,
                      .secondary_gathered = secondary ? in.params : 0,
                      .secondary_group = secondary ? secondary_group : 1});
}

LinkProfile at_bandwidth(LinkProfile link, double gbs) {
  if (gbs > 0) link.bandwidth_gbs = gbs;
  return link;
}

// The links of the collectives over a shard group: all the intra link inside one node; between nodes the
// inter link, at each collective's own bandwidth where one was given.
struct GroupLinks {
  LinkProfile all_reduce, all_gather, reduce_scatter;
};

GroupLinks group_links(bool across_nodes, const ProjectionInput& in) {
  if (!across_nodes) return {in.intra, in.intra, in.intra};
  return {in.inter, at_bandwidth(in.inter, in.inter_all_gather_gbs),
          at_bandwidth(in.inter, in.inter_reduce_scatter_gbs)};
}

// `calls` collectives of a group of n moving `bytes` in all, each paying its latency hops.
double collectives_ms(const LinkProfile& link, int n, int calls, int hops_per_rank, double bytes) {
  return calls * ring_ms(link, n, hops_per_rank, bytes / calls);
}

// zero3's collectives per unit in a group of G: the all-gathers (forward's and backward's, or forward's
// alone where backward gathers inside secondary groups of h on the intra link) and the reduction.
double sharded_ms(const GroupLinks& links, int G, const CommVolume& v, int h, const ProjectionInput& in) {
  const int U = in.units * in.grad_accum;  // every micro-step's
  return collectives_ms(links.all_gather, G, (h > 1 ? 1 : 2) * U, 1, v.gather) +
         collectives_ms(in.intra, h, U, 1, v.secondary) + collectives_ms(links.reduce_scatter, G, U, 1, v.reduce);
}

// The all-reduce of each unit's shard across R groups, moving `bytes`, cut into `pieces` collectives (one
// per piece of the common refinement it owns, unequal groups): each pays its latency hops.
double across_groups_ms(const LinkProfile& link, int R, double bytes, int U, int pieces) {
  if (R <= 1) return 0;
  return U * (ring_ms(link, R, 2, bytes / U) + (pieces - 1) * 2 * (R - 1) * link.alpha_us / 1e3);
}

// The link of hybrid's all-reduce across groups: every rank of a host all-reduces its own shard at once,
// so behind one NIC per host each has its share of the link.
LinkProfile across_link(bool across_nodes, int ranks_per_host, const ProjectionInput& in) {
  if (!across_nodes) return in.intra;
  LinkProfile link = in.inter;
  if (in.nic_per_host) link.bandwidth_gbs /= ranks_per_host;
  return link;
}

ProjectedStep finish(ProjectedStep s, StrategyKind kind, int world, const ProjectionInput& in) {
  const int U = in.units, K = in.grad_accum;
  s.step_ms = s.compute_ms + s.comm_ms;
  // Overlapped, compute hides the communication issued beside it, but not a unit's collective after it
  // (the last) nor a unit's compute before the communication can start (the first): never more than the two
  // in a row. The sharded strategies communicate in every micro-step, each with its own ends, which add up
  // to the same as the whole step's; ddp all-reduces in the last micro-step alone, the earlier ones hiding
  // nothing.
  const auto overlapped = [&](double compute, double comm, int collectives) {
    return std::min(compute + comm, std::max(compute + comm / collectives, comm + compute / U));
  };
  s.step_overlap_ms = kind == StrategyKind::ddp ? s.compute_ms * (K - 1) / K + overlapped(s.compute_ms / K, s.comm_ms, U)
                                                : overlapped(s.compute_ms, s.comm_ms, 3 * U);
  const double t1 = in.compute_ms;  // one rank: no communication
  s.efficiency = in.weak ? t1 / s.step_ms : t1 / (world * s.step_ms);
  s.efficiency_overlap = in.weak ? t1 / s.step_overlap_ms : t1 / (world * s.step_overlap_ms);
  return s;
}

// The step before its communication.
ProjectedStep compute_only(int world, const ProjectionInput& in) {
  ProjectedStep s;
  // Strong scaling splits the batch in whole sequences: the rank holding the most sets the step.
  const double share = in.weak              ? 1.0
                       : in.batch_known     ? std::ceil(double(in.batch) / world) / in.batch
                                            : 1.0 / world;
  s.compute_ms = in.compute_ms * share;
  return s;
}

// ddp and zero3 over the world; zero3's secondary groups of h ranks (1: none).
ProjectedStep world_step(StrategyKind kind, int world, bool across_nodes, int h, const ProjectionInput& in) {
  ProjectedStep s = compute_only(world, in);
  const GroupLinks links = group_links(across_nodes, in);
  s.volume = step_volume(kind, world, world, 1, h, in);
  if (kind == StrategyKind::ddp) s.comm_ms = collectives_ms(links.all_reduce, world, in.units, 2, s.volume.reduce);
  else if (kind == StrategyKind::zero3) s.comm_ms = sharded_ms(links, world, s.volume, h, in);
  else fail("project_step: only ddp, zero3 and hybrid are projected");
  return finish(s, kind, world, in);
}

// zero3's secondary groups where it keeps its shard per node: a node's ranks once the world spans nodes
// (on one node there are none, and the run is plain zero3, as the runtime has it); 1: none.
int secondary_group(StrategyKind kind, bool across_nodes, int node_ranks, const ProjectionInput& in) {
  const bool per_node = projected_strategy(kind, in).secondary_shard.kind == SecondaryShard::Kind::host;
  return per_node && across_nodes ? node_ranks : 1;
}

}  // namespace

ProjectedStep project_step(StrategyKind kind, int world, const ProjectionInput& in) {
  const bool across_nodes = world > in.node_size;
  if (kind != StrategyKind::hybrid)
    return world_step(kind, world, across_nodes, secondary_group(kind, across_nodes, in.node_size, in), in);
  // The zero3 volume inside a shard group (the tools' default group, within a node), then an all-reduce
  // of each shard across the N/G replicas, between nodes once the world spans several.
  const int G = default_shard_group(world, in.node_size);
  if (G == 1) return project_step(StrategyKind::ddp, world, in);  // groups of one run as ddp (ShardPlan::runs_as_ddp)
  ProjectedStep s = compute_only(world, in);
  s.volume = step_volume(kind, world, G, world / G, 1, in);
  s.comm_ms = sharded_ms(group_links(false, in), G, s.volume, 1, in) +
              across_groups_ms(across_link(across_nodes, in.node_size, in), world / G, s.volume.across,
                               in.units * in.grad_accum, 1);
  return finish(s, kind, world, in);
}

ProjectedStep project_step(StrategyKind kind, const ShardGroups& nodes, const ProjectionInput& in) {
  const int world = nodes.world_size();
  const bool across_nodes = nodes.count() > 1;
  const int largest = *std::max_element(nodes.sizes().begin(), nodes.sizes().end());
  // The largest node's ranks gather the most inside it.
  if (kind != StrategyKind::hybrid)
    return world_step(kind, world, across_nodes, secondary_group(kind, across_nodes, largest, in), in);
  // Hosts of one rank each take the default groups by size, which are of one (ddp) on 2 or 3 ranks.
  if (largest == 1 && default_shard_group(world) == 1) return project_step(StrategyKind::ddp, nodes, in);
  ProjectedStep s = compute_only(world, in);
  // Every rank waits for the slowest: the largest node's gathers and reduce-scatters (most hops, most
  // bytes), the smallest node's all-reduce (the largest shard, cut into the most pieces).
  const int smallest = *std::min_element(nodes.sizes().begin(), nodes.sizes().end());
  const int R = nodes.count();
  s.volume = step_volume(kind, world, largest, R, 1, in);
  s.volume.across = step_volume(kind, world, smallest, R, 1, in).across;
  s.comm_ms = sharded_ms(group_links(false, in), largest, s.volume, 1, in) +
              across_groups_ms(across_link(across_nodes, smallest, in), R, s.volume.across,
                               in.units * in.grad_accum, (largest + smallest - 1) / smallest);
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
