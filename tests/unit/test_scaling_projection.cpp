// The alpha-beta scaling projection of zshard-project.
#include <gtest/gtest.h>

#include <zshard/error.h>

#include "runtime/planning/scaling_projection.h"

namespace zshard {
namespace {

ProjectionInput input() {
  ProjectionInput in;
  in.compute_ms = 100;
  in.batch = 8;
  in.params = 1'000'000'000;
  in.units = 10;
  in.elem_bytes = 2;
  in.node_size = 8;
  in.intra = {"test-intra", 0.0, 100.0};  // no latency: only the bandwidth term
  in.inter = {"test-inter", 0.0, 10.0};
  return in;
}

TEST(ScalingProjection, OneRankIsComputeOnly) {
  for (StrategyKind k : {StrategyKind::ddp, StrategyKind::zero3, StrategyKind::hybrid}) {
    const ProjectedStep s = project_step(k, 1, input());
    EXPECT_DOUBLE_EQ(s.step_ms, 100);
    EXPECT_DOUBLE_EQ(s.efficiency, 1);
  }
}

TEST(ScalingProjection, BusBytesOverBandwidth) {
  // ddp at N=4 inside a node: 2 * 2 GB * 3/4 = 3 GB at 100 GB/s = 30 ms.
  EXPECT_NEAR(project_step(StrategyKind::ddp, 4, input()).comm_ms, 30, 1e-9);
  // zero3 moves 1.5x ddp's volume.
  EXPECT_NEAR(project_step(StrategyKind::zero3, 4, input()).comm_ms, 45, 1e-9);
  // hybrid at 16 = two nodes of 8: zero3 inside (3 * 2 GB * 7/8 at 100 GB/s = 52.5 ms) plus an all-reduce of
  // each 2/8 GB shard across 2 replicas over the inter link (2 * 0.25 GB * 1/2 at 10 GB/s = 25 ms).
  EXPECT_NEAR(project_step(StrategyKind::hybrid, 16, input()).comm_ms, 77.5, 1e-9);
}

TEST(ScalingProjection, NodesOfUnequalSizes) {
  // Two equal nodes of 8 are the power-of-two world of 16 with nodes of 8.
  for (StrategyKind k : {StrategyKind::ddp, StrategyKind::zero3, StrategyKind::hybrid})
    EXPECT_NEAR(project_step(k, ShardGroups({8, 8}), input()).comm_ms, project_step(k, 16, input()).comm_ms, 1e-9);
  // 4 + 2: zero3 inside the node of 4 (3 * 2 GB * 3/4 at 100 GB/s = 45 ms), then the node of 2's 1 GB
  // shard all-reduced across the two nodes (2 * 1 GB * 1/2 at 10 GB/s = 100 ms).
  EXPECT_NEAR(project_step(StrategyKind::hybrid, ShardGroups({4, 2}), input()).comm_ms, 145, 1e-9);
  // One node: no inter link, and hybrid is zero3.
  EXPECT_NEAR(project_step(StrategyKind::hybrid, ShardGroups({4}), input()).comm_ms,
              project_step(StrategyKind::zero3, 4, input()).comm_ms, 1e-9);
}

// Hybrid whose groups are all one rank runs as ddp (ShardPlan::runs_as_ddp): its default on 2 or 3 ranks,
// and nodes of one rank each. It cost almost nothing, its all-reduce charged to groups of one.
TEST(ScalingProjection, HybridOverGroupsOfOneIsDdp) {
  for (int world : {2, 3}) {
    EXPECT_NEAR(project_step(StrategyKind::hybrid, world, input()).step_ms,
                project_step(StrategyKind::ddp, world, input()).step_ms, 1e-9);
    EXPECT_GT(project_step(StrategyKind::hybrid, world, input()).comm_ms, 0);
  }
  EXPECT_NEAR(project_step(StrategyKind::hybrid, ShardGroups({1, 1, 1}), input()).step_ms,
              project_step(StrategyKind::ddp, ShardGroups({1, 1, 1}), input()).step_ms, 1e-9);
}

TEST(ScalingProjection, OverlapHidesAllButOneUnit) {
  const ProjectedStep s = project_step(StrategyKind::ddp, 4, input());
  EXPECT_NEAR(s.step_ms, 130, 1e-9);
  EXPECT_NEAR(s.step_overlap_ms, 100 + 30.0 / 10, 1e-9);
  EXPECT_LT(s.efficiency, s.efficiency_overlap);
}

// Communication-bound, a unit's compute is what cannot hide: never slower than compute and comm in a row.
TEST(ScalingProjection, OverlapNeverCostsMoreThanNoOverlap) {
  ProjectionInput in = input();
  in.intra.bandwidth_gbs = 1;  // ddp at 4: 3 GB of bus bytes, 3 s
  for (StrategyKind k : {StrategyKind::ddp, StrategyKind::zero3}) {
    const ProjectedStep s = project_step(k, 4, in);
    ASSERT_GT(s.comm_ms, s.compute_ms);
    EXPECT_NEAR(s.step_overlap_ms, s.comm_ms + s.compute_ms / in.units, 1e-9);
    EXPECT_LE(s.step_overlap_ms, s.step_ms);
  }
}

// Two micro-steps: zero3 gathers and reduces in each, ddp all-reduces once at the step's end.
TEST(ScalingProjection, GradAccumRepeatsTheShardedCollectives) {
  ProjectionInput two = input();
  two.grad_accum = 2;
  EXPECT_NEAR(project_step(StrategyKind::zero3, 4, two).comm_ms, 2 * project_step(StrategyKind::zero3, 4, input()).comm_ms,
              1e-9);
  EXPECT_NEAR(project_step(StrategyKind::ddp, 4, two).comm_ms, project_step(StrategyKind::ddp, 4, input()).comm_ms, 1e-9);
  // Communication-bound (3 s), ddp hides its all-reduce under the last micro-step's compute alone.
  two.intra.bandwidth_gbs = 1;
  const ProjectedStep ddp = project_step(StrategyKind::ddp, 4, two);
  EXPECT_NEAR(ddp.step_overlap_ms, 50 + ddp.comm_ms + 50.0 / two.units, 1e-9);
}

TEST(ScalingProjection, StrongScalingSplitsTheCompute) {
  ProjectionInput in = input();
  in.weak = false;
  const ProjectedStep s = project_step(StrategyKind::ddp, 4, in);
  EXPECT_NEAR(s.compute_ms, 25, 1e-9);
  EXPECT_NEAR(s.efficiency, 100 / (4 * s.step_ms), 1e-12);
  // A known batch of 6 on 4 ranks is split 2, 2, 1, 1: the ranks of two sequences set the step.
  in.batch = 6;
  in.batch_known = true;
  EXPECT_NEAR(project_step(StrategyKind::ddp, 4, in).compute_ms, 100.0 * 2 / 6, 1e-9);
  EXPECT_NEAR(project_step(StrategyKind::ddp, 3, in).compute_ms, 100.0 / 3, 1e-9);
}

// A frozen half of the parameters (a LoRA run's base): gathered as before, with no gradient to reduce.
TEST(ScalingProjection, FrozenParametersAreGatheredNotReduced) {
  ProjectionInput in = input();
  in.frozen_params = in.params / 2;
  // ddp: half of the 30 ms all-reduce; zero3: 2 * 2 GB gathered and 1 GB reduce-scattered, 3/4 of each at
  // 100 GB/s.
  EXPECT_NEAR(project_step(StrategyKind::ddp, 4, in).comm_ms, 15, 1e-9);
  EXPECT_NEAR(project_step(StrategyKind::zero3, 4, in).comm_ms, 37.5, 1e-9);
}

// int8 gathers and int4 reductions: zero3 moves what comm_volume counts, at the link's bandwidth.
TEST(ScalingProjection, QuantizedModesMoveCommVolumesBytes) {
  ProjectionInput in = input();
  in.quantize_gathers = GatherQuantization::int8;
  in.quantize_reductions = ReductionQuantization::int4;
  const ProjectedStep s = project_step(StrategyKind::zero3, 4, in);
  const CommVolume want = comm_volume({.kind = StrategyKind::zero3,
                                       .world = 4,
                                       .group = 4,
                                       .psi = in.params,
                                       .gathered = 2 * in.params,
                                       .param_bytes = 2,
                                       .grad_bytes = 2,
                                       .quantized_gathers = true,
                                       .quantized_reductions = ReductionQuantization::int4});
  EXPECT_DOUBLE_EQ(s.volume.gather, want.gather);
  EXPECT_DOUBLE_EQ(s.volume.reduce, want.reduce);
  EXPECT_DOUBLE_EQ(s.volume.total(), want.total());
  // By hand: 2 GE gathered at 1 + 4/256 bytes each, 1 GE reduced at 1/2 + 4/64, 3/4 of each, at 100 GB/s.
  EXPECT_NEAR(s.comm_ms, (2 * 1.015625 + 0.5625) * 0.75 * 1e9 / 100e9 * 1e3, 1e-9);
  // hybrid's all-reduce across groups keeps the gradients' bytes: 16 ranks, groups of 8 inside nodes.
  const ProjectedStep h = project_step(StrategyKind::hybrid, 16, in);
  EXPECT_DOUBLE_EQ(h.volume.across, project_step(StrategyKind::hybrid, 16, input()).volume.across);
  EXPECT_NEAR(h.comm_ms, (2 * 1.015625 + 0.5625) * 0.875 * 10 + 25, 1e-9);
}

// With a secondary shard per node, backward's gathers run inside each node: on 2 nodes of 8, zero3's
// forward gathers and reduce-scatters cross the inter link as before, backward's gathers the intra link.
TEST(ScalingProjection, SecondaryShardGathersBackwardOnTheIntraLink) {
  ProjectionInput in = input();
  in.intra.alpha_us = 3;
  in.inter.alpha_us = 10;
  in.secondary_per_node = true;
  // Forward's gathers and the reduce-scatters: 1 GE of 2 bytes each, 15/16 of it, at 10 GB/s, and 10 units
  // of 15 hops at 10 us; backward's: 1 GE, 7/8 of it, at 100 GB/s, and 10 units of 7 hops at 3 us.
  const double over_world = 2 * (2e9 * 15 / 16 / 10e9 * 1e3 + 10 * 15 * 10e-3);
  const double inside_nodes = 2e9 * 7 / 8 / 100e9 * 1e3 + 10 * 7 * 3e-3;
  const ProjectedStep s = project_step(StrategyKind::zero3, 16, in);
  EXPECT_NEAR(s.comm_ms, over_world + inside_nodes, 1e-9);
  EXPECT_DOUBLE_EQ(s.volume.secondary, 2e9 * 7 / 8);
  EXPECT_DOUBLE_EQ(s.volume.gather, 2e9 * 15 / 16);
  in.secondary_per_node = false;
  EXPECT_NEAR(project_step(StrategyKind::zero3, 16, in).comm_ms, 1.5 * over_world, 1e-9);
  // The same two nodes by their sizes; one node has no secondary group but the world: plain zero3.
  in.secondary_per_node = true;
  EXPECT_NEAR(project_step(StrategyKind::zero3, ShardGroups({8, 8}), in).comm_ms, over_world + inside_nodes, 1e-9);
  const ProjectedStep one_node = project_step(StrategyKind::zero3, 8, in);
  in.secondary_per_node = false;
  EXPECT_DOUBLE_EQ(one_node.comm_ms, project_step(StrategyKind::zero3, 8, in).comm_ms);
  // Nodes of 4 and 2: the node of 4 gathers the most inside it, 3/4 of 1 GE.
  in.secondary_per_node = true;
  const double inside_4 = 2e9 * 3 / 4 / 100e9 * 1e3 + 10 * 3 * 3e-3;
  EXPECT_NEAR(project_step(StrategyKind::zero3, ShardGroups({4, 2}), in).comm_ms,
              2 * (2e9 * 5 / 6 / 10e9 * 1e3 + 10 * 5 * 10e-3) + inside_4, 1e-9);
}

// Each mode for the strategies that take it, as the runtime's tools apply one set of flags: ddp reduces
// and gathers nothing quantized, hybrid keeps no secondary shard.
TEST(ScalingProjection, ModesApplyWhereTheStrategyTakesThem) {
  ProjectionInput in = input();
  in.quantize_gathers = GatherQuantization::int8;
  in.quantize_reductions = ReductionQuantization::int8;
  in.secondary_per_node = true;
  EXPECT_DOUBLE_EQ(project_step(StrategyKind::ddp, 16, in).comm_ms, project_step(StrategyKind::ddp, 16, input()).comm_ms);
  const ProjectedStep hybrid = project_step(StrategyKind::hybrid, 16, in);
  EXPECT_EQ(hybrid.volume.secondary, 0);
  in.secondary_per_node = false;
  EXPECT_DOUBLE_EQ(hybrid.comm_ms, project_step(StrategyKind::hybrid, 16, in).comm_ms);
  EXPECT_LT(hybrid.comm_ms, project_step(StrategyKind::hybrid, 16, input()).comm_ms);
}

// Open MPI over TCP: each collective at its own fraction of the link between nodes.
TEST(ScalingProjection, InterBandwidthPerCollective) {
  ProjectionInput in = input();
  in.inter_all_gather_gbs = 5;
  in.inter_reduce_scatter_gbs = 2;
  // zero3 on 2 nodes of 8: 2 GB gathered twice at 5 GB/s, reduce-scattered at 2 GB/s, 15/16 of each.
  EXPECT_NEAR(project_step(StrategyKind::zero3, 16, in).comm_ms, (2 * 2.0 / 5 + 2.0 / 2) * 15 / 16 * 1e3, 1e-9);
  // ddp's all-reduce keeps the link's bandwidth; inside one node, and hybrid's groups, the intra link.
  for (int world : {4, 16})
    for (StrategyKind k : {StrategyKind::ddp, StrategyKind::hybrid})
      EXPECT_DOUBLE_EQ(project_step(k, world, in).comm_ms, project_step(k, world, input()).comm_ms);
  EXPECT_DOUBLE_EQ(project_step(StrategyKind::zero3, 8, in).comm_ms, project_step(StrategyKind::zero3, 8, input()).comm_ms);
}

// One NIC per host: hybrid's all-reduce across groups, which all of a host's ranks run at once, shares it.
TEST(ScalingProjection, ANicPerHostIsSharedByHybridsAllReduce) {
  ProjectionInput in = input();
  in.nic_per_host = true;
  // 16 = 2 nodes of 8: the 25 ms all-reduce of one rank, 8 ranks behind one link.
  EXPECT_NEAR(project_step(StrategyKind::hybrid, 16, in).comm_ms, 52.5 + 8 * 25, 1e-9);
  // 4 + 2: the node of 2's 100 ms, 2 ranks behind one link.
  EXPECT_NEAR(project_step(StrategyKind::hybrid, ShardGroups({4, 2}), in).comm_ms, 45 + 2 * 100, 1e-9);
  // A ring over the world crosses each host's link once each way.
  for (StrategyKind k : {StrategyKind::ddp, StrategyKind::zero3})
    EXPECT_DOUBLE_EQ(project_step(k, 16, in).comm_ms, project_step(k, 16, input()).comm_ms);
}

TEST(ScalingProjection, AmdahlAndKarpFlattAreInverse) {
  EXPECT_DOUBLE_EQ(amdahl_efficiency(0, 64), 1);
  const double s = 0.1;
  const double speedup = amdahl_efficiency(s, 4) * 4;
  EXPECT_NEAR(karp_flatt(speedup, 4), s, 1e-12);
  EXPECT_THROW(link_profile("carrier-pigeon"), UsageError);
  EXPECT_EQ(link_profile("ib").name, "ib");
}

}  // namespace
}  // namespace zshard
