// --rank-batches auto: splitting the global batch over the ranks by their measured speed. Pure functions
// of their inputs, so that every rank, given the same all-gathered numbers, takes the same decision.
#pragma once
#include <vector>

namespace zshard {

// Splits `total` sequences into one integer per rank, in proportion to `seq_per_s` (each rank's measured
// throughput, > 0), each at least 1 and at most caps[r] (needs ranks <= total <= sum of caps). The
// proportional shares are clamped to [1, cap] with one common scale factor, then rounded by largest
// remainder (ties to the lower rank).
std::vector<int> proportional_split(int total, const std::vector<double>& seq_per_s, const std::vector<int>& caps);

// The compute time of a step under `split`: the slowest rank's sequences over its throughput.
double predicted_step_seconds(const std::vector<int>& split, const std::vector<double>& seq_per_s);

// The split the ranks move to: the proportional one, unless it would predict less than `min_gain`
// (a fraction) faster steps than `current`, so that measurement noise does not shuffle the batch.
std::vector<int> rebalanced_split(const std::vector<int>& current, const std::vector<double>& seq_per_s,
                                  const std::vector<int>& caps, double min_gain = 0.03);

}  // namespace zshard
