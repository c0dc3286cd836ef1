#include "runtime/planning/rank_balancer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <zshard/error.h>

namespace zshard {

std::vector<int> proportional_split(int total, const std::vector<double>& seq_per_s, const std::vector<int>& caps) {
  const int n = int(seq_per_s.size());
  if (n == 0 || int(caps.size()) != n) fail("proportional_split: one throughput and one cap per rank");
  for (int r = 0; r < n; ++r)
    if (!(std::isfinite(seq_per_s[r]) && seq_per_s[r] > 0) || caps[r] < 1)
      fail("proportional_split: rank ", r, " has throughput ", seq_per_s[r], " and cap ", caps[r]);
  if (total < n || std::accumulate(caps.begin(), caps.end(), int64_t(0)) < total)
    fail("proportional_split: ", total, " sequences do not fit ", n, " ranks of at least 1 within their caps");

  // share(scale) = clamp(scale * seq_per_s, 1, cap) sums to n at scale 0 and to the caps' sum for a large
  // scale, continuously and monotonically: bisect for the scale where it sums to `total`.
  const auto share = [&](double scale, int r) { return std::clamp(scale * seq_per_s[r], 1.0, double(caps[r])); };
  const auto sum_at = [&](double scale) {
    double s = 0;
    for (int r = 0; r < n; ++r) s += share(scale, r);
    return s;
  };
  double lo = 0, hi = 1;
  while (sum_at(hi) < total) hi *= 2;
  for (int i = 0; i < 200 && lo < hi; ++i) {
    const double mid = lo + (hi - lo) / 2;
    if (mid <= lo || mid >= hi) break;
    (sum_at(mid) < total ? lo : hi) = mid;
  }

  // Largest remainder: every rank its whole part, then one more each to the largest fractions.
  std::vector<int> split(n);
  std::vector<double> fraction(n);
  int given = 0;
  for (int r = 0; r < n; ++r) {
    const double x = share(hi, r);
    split[r] = std::min(int(std::floor(x)), caps[r]);
    fraction[r] = x - split[r];
    given += split[r];
  }
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return fraction[a] > fraction[b]; });
  // The bisection leaves the shares within rounding of `total`: one pass settles any difference.
  for (int r : order) {
    if (given < total && split[r] < caps[r]) ++split[r], ++given;
  }
  for (auto it = order.rbegin(); it != order.rend() && given > total; ++it)
    if (split[*it] > 1) --split[*it], --given;
  return split;
}

double predicted_step_seconds(const std::vector<int>& split, const std::vector<double>& seq_per_s) {
  double slowest = 0;
  for (size_t r = 0; r < split.size(); ++r) slowest = std::max(slowest, split[r] / seq_per_s[r]);
  return slowest;
}

std::vector<int> rebalanced_split(const std::vector<int>& current, const std::vector<double>& seq_per_s,
                                  const std::vector<int>& caps, double min_gain) {
  const int total = std::accumulate(current.begin(), current.end(), 0);
  const std::vector<int> proposed = proportional_split(total, seq_per_s, caps);
  bool current_fits = true;
  for (size_t r = 0; r < current.size(); ++r) current_fits &= current[r] <= caps[r];
  const double now = predicted_step_seconds(current, seq_per_s);
  return current_fits && predicted_step_seconds(proposed, seq_per_s) > (1 - min_gain) * now ? current : proposed;
}

}  // namespace zshard
