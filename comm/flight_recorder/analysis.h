// zshard-trace's analysis: the ranks' flight-recorder dumps (comm/flight_recorder/dump_file.h) lined up by group and
// collective number, a verdict first, then a table of what each rank was doing.
//
// The verdict, in order of precedence:
//   - the first collective at which the members of a group disagree (op, count, dtype, root or label);
//   - a stall: the collective some ranks waited in while others of its group never entered it (or left
//     no dump), naming those ranks; where several groups stall, the one whose absent ranks were not
//     themselves waiting in another collective (the cause, not a consequence), then the longest wait;
//   - a collective every member entered and none completed;
//   - else, that nothing was in flight.
#pragma once
#include <string>
#include <vector>

#include "comm/flight_recorder/dump_file.h"

namespace zshard {

struct TraceReport {
  std::string verdict;             // one line
  std::vector<std::string> lines;  // the table, and notes
};

// The dumps (rank-NNNNN.trace) in `dir`. Throws UsageError when `dir` is not a directory or holds none,
// or a dump's name is not a regular file (read_trace), and zshard::Error naming the first file that is
// corrupt or truncated.
std::vector<comm::trace::RankTrace> read_trace_dir(const std::string& dir);

// The dumps of the newest job among `dumps` (the others are named in a note).
TraceReport analyse_traces(const std::vector<comm::trace::RankTrace>& dumps);

}  // namespace zshard
