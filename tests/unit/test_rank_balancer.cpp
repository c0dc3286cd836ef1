#include <gtest/gtest.h>

#include <numeric>

#include "runtime/planning/rank_balancer.h"

namespace zshard {
namespace {

constexpr int kNoCap = 1 << 20;

int sum(const std::vector<int>& v) { return std::accumulate(v.begin(), v.end(), 0); }

TEST(RankBalancer, ProportionalToThroughput) {
  EXPECT_EQ(proportional_split(24, {1, 1, 2}, {kNoCap, kNoCap, kNoCap}), (std::vector<int>{6, 6, 12}));
  EXPECT_EQ(proportional_split(8, {3, 1, 2, 2}, {kNoCap, kNoCap, kNoCap, kNoCap}), (std::vector<int>{3, 1, 2, 2}));
  EXPECT_EQ(proportional_split(9, {5, 5, 5}, {kNoCap, kNoCap, kNoCap}), (std::vector<int>{3, 3, 3}));
}

TEST(RankBalancer, LargestRemainderRounding) {
  // Shares 10/3 each: 3 each, the one left over to the lowest rank (ties).
  EXPECT_EQ(proportional_split(10, {1, 1, 1}, {kNoCap, kNoCap, kNoCap}), (std::vector<int>{4, 3, 3}));
  // Shares 1.4, 2.8, 5.8: whole parts 1, 2, 5; the two left go to the fractions .8 and .8.
  EXPECT_EQ(proportional_split(10, {1.4, 2.8, 5.8}, {kNoCap, kNoCap, kNoCap}), (std::vector<int>{1, 3, 6}));
  // Shares 2.5, 7.5 -> a tie of fractions: the lower rank wins.
  EXPECT_EQ(proportional_split(10, {1, 3}, {kNoCap, kNoCap}), (std::vector<int>{3, 7}));
}

TEST(RankBalancer, AtLeastOneSequencePerRank) {
  const std::vector<int> split = proportional_split(6, {1000, 1, 1}, {kNoCap, kNoCap, kNoCap});
  EXPECT_EQ(split, (std::vector<int>{4, 1, 1}));
  EXPECT_EQ(proportional_split(3, {1e9, 1e-9, 1}, {kNoCap, kNoCap, kNoCap}), (std::vector<int>{1, 1, 1}));
}

TEST(RankBalancer, RespectsCaps) {
  // Rank 2 would take 12 of 24, its memory allows 8: the rest goes to the others in proportion.
  EXPECT_EQ(proportional_split(24, {1, 1, 2}, {kNoCap, kNoCap, 8}), (std::vector<int>{8, 8, 8}));
  EXPECT_EQ(proportional_split(24, {1, 3, 4}, {20, 5, 5}), (std::vector<int>{14, 5, 5}));
  // Caps and the lower bound together: exactly what fits.
  EXPECT_EQ(proportional_split(5, {100, 1, 1}, {3, 1, 1}), (std::vector<int>{3, 1, 1}));
  EXPECT_ANY_THROW(proportional_split(10, {1, 1}, {4, 5}));  // the caps hold 9
  EXPECT_ANY_THROW(proportional_split(1, {1, 1}, {4, 5}));   // fewer sequences than ranks
  EXPECT_ANY_THROW(proportional_split(4, {1, 0}, {4, 4}));   // no throughput
}

TEST(RankBalancer, SumsToTotalAndIsDeterministic) {
  uint32_t state = 12345;
  const auto next = [&] { return (state = state * 1664525u + 1013904223u) >> 8; };
  for (int trial = 0; trial < 500; ++trial) {
    const int n = 1 + int(next() % 8);
    std::vector<double> speed(n);
    std::vector<int> caps(n);
    int cap_sum = 0;
    for (int r = 0; r < n; ++r) {
      speed[r] = 0.01 + double(next() % 100000) / 97.0;
      caps[r] = 1 + int(next() % 40);
      cap_sum += caps[r];
    }
    const int total = n + int(next() % (cap_sum - n + 1));
    const std::vector<int> split = proportional_split(total, speed, caps);
    EXPECT_EQ(sum(split), total);
    for (int r = 0; r < n; ++r) {
      EXPECT_GE(split[r], 1);
      EXPECT_LE(split[r], caps[r]);
    }
    EXPECT_EQ(split, proportional_split(total, speed, caps));
  }
}

TEST(RankBalancer, RebalanceKeepsTheSplitUnlessTheGainIsReal) {
  const std::vector<int> caps = {kNoCap, kNoCap, kNoCap};
  // 8,8,8 on speeds 1,1,2 takes 8 s; 6,6,12 takes 6 s: move.
  EXPECT_EQ(rebalanced_split({8, 8, 8}, {1, 1, 2}, caps), (std::vector<int>{6, 6, 12}));
  // The proportional split would be 6,5,13, no faster than 6,6,12 (6 s for the slowest either way): stay.
  EXPECT_EQ(proportional_split(24, {1, 1, 2.3}, caps), (std::vector<int>{6, 5, 13}));
  EXPECT_EQ(rebalanced_split({6, 6, 12}, {1, 1, 2.3}, caps), (std::vector<int>{6, 6, 12}));
  // A current split over a cap always moves.
  EXPECT_EQ(rebalanced_split({6, 6, 12}, {1, 1, 2}, {kNoCap, kNoCap, 10}), (std::vector<int>{7, 7, 10}));
  EXPECT_DOUBLE_EQ(predicted_step_seconds({6, 6, 12}, {1, 2, 4}), 6.0);
}

}  // namespace
}  // namespace zshard
