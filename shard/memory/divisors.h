// The divisors of n in increasing order, found in O(sqrt(n)): --batch may be close to 2^31.
#pragma once
#include <cstdint>
#include <vector>

namespace zshard {

inline std::vector<int> divisors(int n) {
  std::vector<int> low, high;
  for (int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    low.push_back(int(d));
    if (d * d != n) high.push_back(int(n / d));
  }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

}  // namespace zshard
