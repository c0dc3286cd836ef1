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

TEST(ScalingProjection, OverlapHidesAllButOneUnit) {
  const ProjectedStep s = project_step(StrategyKind::ddp, 4, input());
  EXPECT_NEAR(s.step_ms, 130, 1e-9);
  EXPECT_NEAR(s.step_overlap_ms, 100 + 30.0 / 10, 1e-9);
  EXPECT_LT(s.efficiency, s.efficiency_overlap);
}

TEST(ScalingProjection, StrongScalingSplitsTheCompute) {
  ProjectionInput in = input();
  in.weak = false;
  const ProjectedStep s = project_step(StrategyKind::ddp, 4, in);
  EXPECT_NEAR(s.compute_ms, 25, 1e-9);
  EXPECT_NEAR(s.efficiency, 100 / (4 * s.step_ms), 1e-12);
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
