#include "comm/rank_list.h"

namespace zshard::comm {

std::string rank_list(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t last = i;
    while (last + 1 < ranks.size() && ranks[last + 1] == ranks[last] + 1) ++last;
    if (last < i + 2) last = i;  // two in a row read better as "4, 5"
    if (i) text += ", ";
    text += std::to_string(ranks[i]);
    if (last > i) text.append("-").append(std::to_string(ranks[last]));
    i = last + 1;
  }
  return text;
}

}  // namespace zshard::comm
