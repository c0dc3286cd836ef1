// How a line names a set of ranks, in a report or an error: "rank 2", "ranks 0, 1", "ranks 0-3, 6". A run of
// three or more consecutive ranks is shortened, so that a group of 64 reads in one phrase.
#pragma once
#include <string>
#include <vector>

namespace zshard::comm {

std::string rank_list(const std::vector<int>& ascending_ranks);

}  // namespace zshard::comm
