// Scaling projection: step time of ddp, zero3 and hybrid at N ranks from a measured single-rank compute
// time and an alpha-beta link model (time of a message = alpha + bytes / bandwidth, ring collectives:
// (n-1) latency hops per all-gather or reduce-scatter, 2(n-1) per all-reduce, bus bytes as nccl-tests
// count them). Communication is per unit, as zshard issues it. Without overlap a step is compute +
// communication; with overlap what cannot hide: one unit's communication after the compute (ddp's last
// all-reduce, zero3's last reduce-scatter), or one unit's compute before the communication can start,
// whichever is longer, in each micro-step that communicates (ddp's last only). The bytes are comm_volume's
// (shard/comm_volume.h), with the communication modes the runtime would run.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <zshard/plan.h>

#include "shard/comm_volume.h"

namespace zshard {

struct LinkProfile {
  std::string name;
  double alpha_us = 0;       // per hop latency
  double bandwidth_gbs = 0;  // bus bandwidth per rank, GB/s (1e9)
};

// "nvlink", "pcie", "ib" (InfiniBand HDR); throws UsageError naming the valid ones otherwise.
LinkProfile link_profile(const std::string& name);
std::vector<std::string> link_profile_names();

struct ProjectionInput {
  double compute_ms = 0;  // one rank's compute time for batch x grad_accum sequences (step time at N = 1)
  int batch = 1;          // sequences of a micro-step
  int grad_accum = 1;     // micro-steps that compute_ms covers: zero3 and hybrid gather and reduce in each
  bool weak = true;       // weak: every rank keeps `batch`; strong: the global batch is `batch`
  bool batch_known = false;  // strong: `batch` is the run's, split in whole sequences (the slowest rank's ceil)
  int64_t params = 0;     // Ψ
  int64_t frozen_params = 0;  // of Ψ, frozen: gathered like the others, with no gradient to reduce
  int units = 1;          // collectives per pass (one per unit)
  int elem_bytes = 4;
  int node_size = kDefaultNodeRanks;  // ranks on one intra link; bounds hybrid's default shard group
  LinkProfile intra;                  // links inside a node (all of ddp/zero3 when N <= node_size)
  LinkProfile inter;      // links between nodes
  // Open MPI over TCP reaches a different fraction of a link in each collective: the bandwidths of the
  // all-gathers and the in-group reductions between nodes (0: inter.bandwidth_gbs, which stands for the
  // all-reduce's). The all-to-all of quantized reductions takes the reduce-scatter's.
  double inter_all_gather_gbs = 0;
  double inter_reduce_scatter_gbs = 0;
  // Whether a host's ranks share one NIC (false: one per rank, as GPUs each with their own). Where all of
  // a host's ranks cross at once (hybrid's all-reduce across groups) they share its bandwidth; a ring over
  // the world in rank order crosses each host's link once each way whatever the ranks per host.
  bool nic_per_host = false;
  // The communication modes (--quantize-gathers, --quantize-reductions), and zero3's secondary shard kept
  // per node (--secondary-shard host: once the world spans nodes, backward's gathers run inside each
  // node, on the intra link), each for the strategies that take it.
  GatherQuantization quantize_gathers = GatherQuantization::none;
  ReductionQuantization quantize_reductions = ReductionQuantization::none;
  bool secondary_per_node = false;
};

// The strategy options `kind` runs with: in's modes where it takes them (strategy_options_for).
StrategyOptions projected_strategy(StrategyKind kind, const ProjectionInput& in);

struct ProjectedStep {
  double compute_ms = 0;
  double comm_ms = 0;
  double step_ms = 0;          // no overlap
  double step_overlap_ms = 0;  // communication overlapped with compute
  double efficiency = 0;       // weak: t(1)/t(N); strong: t(1)/(N t(N)); without overlap
  double efficiency_overlap = 0;
  // Bus bytes per rank and step, of the rank the step waits for in each term (hybrid on unequal nodes:
  // the largest node's gathers and reductions, the smallest node's all-reduce across them).
  CommVolume volume;
};

ProjectedStep project_step(StrategyKind kind, int world, const ProjectionInput& in);
// The step on a cluster of nodes of the given sizes (4,2: a node of 4 ranks beside a node of 2): ddp and
// zero3 over the world, hybrid sharding inside each node (in.intra) and reducing across them (in.inter).
ProjectedStep project_step(StrategyKind kind, const ShardGroups& nodes, const ProjectionInput& in);

// Amdahl: speed-up 1/(s + (1-s)/N) of a serial fraction s; efficiency is speed-up / N.
double amdahl_efficiency(double serial_fraction, int world);
// Karp-Flatt: the serial fraction that explains a measured speed-up S at N ranks.
double karp_flatt(double speedup, int world);

}  // namespace zshard
