// The divisors of n in increasing order, found in O(sqrt(n)) from those up to 10^7 and their quotients:
// all of them below 10^14 (a --batch close to 2^31; a global batch, --batch times --grad-accum).
#pragma once
#include <cstdint>
#include <vector>

namespace zshard {

template <class Int>
std::vector<Int> divisors(Int n) {
  std::vector<Int> low, high;
  for (int64_t d = 1; d * d <= int64_t(n) && d <= 10'000'000; ++d) {
    if (n % d != 0) continue;
    low.push_back(Int(d));
    if (d * d != int64_t(n)) high.push_back(Int(n / d));
  }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

}  // namespace zshard
