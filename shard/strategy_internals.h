// What zshard's tools and the plan need of the strategy beyond the public API (strategy.h): spelling
// group sizes as the flags take them, and checking sizes under the name of whatever gave them.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace zshard {

// "4,2": a list of sizes as --shard-group and --nodes take it.
std::string join_sizes(const std::vector<int>& sizes);

// Units are padded to a multiple of every group's size, their least common multiple: up to that many
// elements of padding per unit, and a grid of that many slots for the shard boundaries. Past this bound
// the padding alone would outweigh the models zshard trains.
constexpr int64_t kMaxPadMultiple = int64_t(1) << 20;
// Refuses, with a UsageError naming `what` gave them (an option, a flag, the hosts), group sizes
// ShardGroups cannot take: a size below 1, more ranks in all than an int holds, or a least common
// multiple above kMaxPadMultiple.
void check_group_sizes(const std::vector<int>& sizes, std::string_view what);

}  // namespace zshard
