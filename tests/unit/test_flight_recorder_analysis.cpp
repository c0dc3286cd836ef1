// zshard-trace's verdicts on dumps made here, one situation each: a rank that never entered the
// collective its group waited in, one that left no dump, one stopped inside it, ranks that disagree, a
// running job, a job a rank ended, a stall caused by another, the collective check's own wait, and the
// dumps of an older job beside the newest.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include <zshard/error.h>

#include "comm/flight_recorder/analysis.h"
#include "comm/rank_list.h"
#include "tests/support/test_support.h"

namespace zshard {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using comm::Collective;
using namespace comm::trace;  // the dump's records, as the analysis reads them

constexpr int64_t kSecond = 1'000'000'000;

GroupEntry group(const char* key, const char* label, int size, int rank, uint64_t issued) {
  GroupEntry g{};
  std::strncpy(g.key, key, sizeof g.key - 1);
  std::strncpy(g.label, label, sizeof g.label - 1);
  g.size = size;
  g.rank = rank;
  g.issued = issued;
  return g;
}

// Collectives 1..n of group 0 (the world), each an all_gather of 16 f32 for unit n, a second apart and
// completed, except those the test changes afterwards.
std::vector<Record> completed(int n) {
  std::vector<Record> records;
  for (int i = 1; i <= n; ++i) {
    Record r{};
    r.seq = r.group_seq = uint64_t(i);
    r.issued_ns = i * kSecond;
    r.ended_ns = r.issued_ns + 1000;
    r.count = 16;
    r.unit = i;
    r.root = -1;
    r.op = uint8_t(Collective::all_gather);
    r.dtype = uint8_t(DType::f32);
    r.reduce = comm::trace::kNoReduce;
    r.purpose = uint8_t(Purpose::params);
    r.state = uint8_t(State::completed);
    records.push_back(r);
  }
  return records;
}

RankTrace dump(int rank, int world, std::vector<Record> records, std::vector<GroupEntry> groups = {},
               Reason reason = Reason::abort, uint64_t job = 7, int64_t dump_at = 10 * kSecond) {
  RankTrace t;
  t.path = "rank-" + std::to_string(rank) + ".trace";
  t.header = {};
  t.header.job = job;
  t.header.rank = rank;
  t.header.world_size = world;
  t.header.reason = uint8_t(reason);
  t.header.dump_steady_ns = dump_at;
  t.header.dump_wall_ns = int64_t(job) * kSecond;
  t.header.issued = records.empty() ? 0 : records.back().seq;
  std::strcpy(t.header.host, "hosta");
  t.groups = groups.empty() ? std::vector<GroupEntry>{group("world", "", world, rank, t.header.issued)} : groups;
  t.records = std::move(records);
  return t;
}

// Ranks 0 and 1 waited 5 s in collective #6 (unit 6) until their deadline; rank 2's last was #5.
std::vector<RankTrace> stall_at_6() {
  std::vector<RankTrace> dumps;
  for (int r = 0; r < 2; ++r) {
    std::vector<Record> records = completed(6);
    records.back().issued_ns = 5 * kSecond;
    records.back().ended_ns = 10 * kSecond;
    records.back().state = uint8_t(State::timed_out);
    dumps.push_back(dump(r, 3, records));
  }
  dumps.push_back(dump(2, 3, completed(5), {}, Reason::terminated));
  return dumps;
}

// The ranks a verdict, a collective check or the memory report names.
TEST(RankList, ShortensRunsOfThreeOrMore) {
  EXPECT_EQ(comm::rank_list({2}), "rank 2");
  EXPECT_EQ(comm::rank_list({0, 1}), "ranks 0, 1");
  EXPECT_EQ(comm::rank_list({0, 1, 2, 3, 6}), "ranks 0-3, 6");
  EXPECT_EQ(comm::rank_list({0, 2, 3, 4, 7, 8}), "ranks 0, 2-4, 7, 8");
  EXPECT_EQ(comm::rank_list({5, 6, 7}), "ranks 5-7");
}

TEST(TraceAnalysis, NamesTheRankThatNeverEnteredTheCollective) {
  const TraceReport report = analyse_traces(stall_at_6());
  EXPECT_EQ(report.verdict,
            "rank 2 never entered collective #6 (all_gather, params, unit 6, world); the other ranks waited 5.0 s");
  ASSERT_EQ(report.lines.size(), 4u);  // a header and a row per rank
  EXPECT_THAT(report.lines[1], HasSubstr("#6 (all_gather, params, unit 6, world) timed out after 5.0 s"));
  EXPECT_THAT(report.lines[3], HasSubstr("terminated"));
}

TEST(TraceAnalysis, NamesARankThatLeftNoDump) {
  std::vector<RankTrace> dumps = stall_at_6();
  dumps.pop_back();
  const TraceReport report = analyse_traces(dumps);
  EXPECT_EQ(report.verdict, "rank 2 left no dump and never completed collective #6 (all_gather, params, unit 6, "
                            "world); the other ranks waited 5.0 s");
  EXPECT_THAT(report.lines[3], StartsWith("2 "));
  EXPECT_THAT(report.lines[3], HasSubstr("no dump"));
}

TEST(TraceAnalysis, NamesARankStoppedInsideTheCollective) {
  std::vector<RankTrace> dumps = stall_at_6();
  std::vector<Record> records = completed(6);
  records.back().issued_ns = 5 * kSecond;
  records.back().state = uint8_t(State::waiting);
  records.back().ended_ns = 0;
  dumps[2] = dump(2, 3, records, {}, Reason::terminated);
  dumps[2].header.paused_ns = 4 * kSecond;
  EXPECT_EQ(analyse_traces(dumps).verdict, "rank 2 stopped running inside collective #6 (all_gather, params, unit "
                                           "6, world) for 4.0 s; the other ranks waited 5.0 s");
  // Stopped in its next collective, after the others' one completed on it: still the cause.
  records.push_back(records.back());
  records[5].state = uint8_t(State::completed);
  records[6].seq = records[6].group_seq = 7;
  dumps[2] = dump(2, 3, records, {}, Reason::terminated);
  dumps[2].header.paused_ns = 4 * kSecond;
  EXPECT_EQ(analyse_traces(dumps).verdict, "rank 2 stopped running inside collective #7 (all_gather, params, unit "
                                           "6, world) for 4.0 s; the other ranks waited 5.0 s");
  // Stopped outside any collective: named with the collective the others waited in.
  dumps[2] = dump(2, 3, completed(5), {}, Reason::terminated);
  dumps[2].header.paused_ns = 4 * kSecond;
  EXPECT_EQ(analyse_traces(dumps).verdict, "rank 2 stopped running for 4.0 s outside any collective; the other ranks "
                                           "waited 5.0 s in collective #6 (all_gather, params, unit 6, world)");
  // A pause that ended long before the waits is no stop.
  dumps[2].header.paused_ago_ns = 60 * kSecond;
  EXPECT_THAT(analyse_traces(dumps).verdict, StartsWith("rank 2 never entered collective #6"));
}

TEST(TraceAnalysis, NamesTheFirstCollectiveWhereTheRanksDisagree) {
  std::vector<RankTrace> dumps;
  for (int r = 0; r < 3; ++r) {
    std::vector<Record> records = completed(6);
    if (r == 1) records[3].unit = 5;  // collective #4 on rank 1
    if (r == 1) records[4].count = 99;  // later differences are not the first
    dumps.push_back(dump(r, 3, records));
  }
  EXPECT_EQ(analyse_traces(dumps).verdict,
            "the ranks of world disagree at its collective #4: rank 1 issued all_gather of 16 f32 (params, unit 5); "
            "ranks 0, 2 issued all_gather of 16 f32 (params, unit 4)");
}

TEST(TraceAnalysis, ARunningJobHasNoStall) {
  std::vector<RankTrace> dumps;
  for (int r = 0; r < 2; ++r) {
    std::vector<Record> records = completed(6);
    if (r == 0) {  // rank 0 is 2 ms into #6, rank 1 has not issued it yet
      records.back().issued_ns = 10 * kSecond - 2'000'000;
      records.back().ended_ns = 0;
      records.back().state = uint8_t(State::in_flight);
    } else {
      records.pop_back();
    }
    dumps.push_back(dump(r, 2, records, {}, Reason::request));
  }
  EXPECT_EQ(analyse_traces(dumps).verdict,
            "no rank waited on another in the 2 dump(s) of 2 ranks, and their common collectives agree; the oldest "
            "collective in flight, #6 (all_gather, params, unit 6, world) on rank 0, had waited 0.002 s");
}

TEST(TraceAnalysis, NamesTheRankThatEndedTheJob) {
  std::vector<RankTrace> dumps;
  for (int r = 0; r < 3; ++r) dumps.push_back(dump(r, 3, completed(6), {}, r == 1 ? Reason::abort : Reason::terminated));
  EXPECT_EQ(analyse_traces(dumps).verdict, "rank 1 ended the job on an error of its own (the job's output says which) "
                                           "before any rank waited long on another");
  dumps[1].header.reason = uint8_t(Reason::fatal_signal);
  dumps[1].header.signal = 11;
  EXPECT_EQ(analyse_traces(dumps).verdict, "rank 1 ended the job on a fatal signal (11) before any rank waited long on "
                                           "another");
}

// Rank 2 stalls the job in #6; ranks 0 and 1 time out there, then wait longer in the collective check's
// comparison (on a group of its own), which rank 2 never joins: the stall in #6 is the cause.
TEST(TraceAnalysis, TheCollectiveChecksOwnWaitComesLast) {
  std::vector<RankTrace> dumps = stall_at_6();
  dumps.pop_back();  // rank 2 left no dump
  for (RankTrace& t : dumps) {
    t.groups.push_back(group("world.9", "collective check", 3, t.header.rank, 1));
    Record check = t.records.back();
    check.seq = 7;
    check.group_seq = 1;
    check.group = 1;
    check.purpose = uint8_t(Purpose::check);
    check.issued_ns = 10 * kSecond;
    check.ended_ns = 16 * kSecond;  // a wait of 6 s, past #6's 5 s
    t.records.push_back(check);
    t.header.dump_steady_ns = 16 * kSecond;
    t.header.issued = 7;
  }
  EXPECT_EQ(analyse_traces(dumps).verdict, "rank 2 left no dump and never completed collective #6 (all_gather, "
                                           "params, unit 6, world); the other ranks waited 5.0 s");
}

// Rank 1 computes and never enters its groups' next collectives. Rank 0 waits for it in their shard group,
// rank 3 in their replica group, and rank 2 waits for rank 3 in theirs: the cause is rank 1.
TEST(TraceAnalysis, TheCauseComesBeforeItsConsequences) {
  const auto groups = [](int rank, uint64_t shard_issued, uint64_t replica_issued) {
    const bool first = rank < 2, even = rank % 2 == 0;
    return std::vector<GroupEntry>{
        group(first ? "world.0:0" : "world.0:1", first ? "shard group 0" : "shard group 1", 2, rank % 2, shard_issued),
        group(even ? "world.1:0" : "world.1:1", even ? "replicas 0" : "replicas 1", 2, rank / 2, replica_issued)};
  };
  // One collective per group: shard #3 at 3 s, replica #2 at 4 s; waits open from the given time.
  const auto records = [](int open_group, int64_t open_since) {
    std::vector<Record> out = completed(4);
    for (size_t i = 0; i < out.size(); ++i) {
      out[i].group = int(i % 2);
      out[i].group_seq = i / 2 + 1;
    }
    if (open_group >= 0) {
      Record r = out[size_t(open_group)];
      r.seq = 5;
      r.group_seq = 3;
      r.issued_ns = open_since;
      r.ended_ns = 0;
      r.state = uint8_t(State::waiting);
      out.push_back(r);
    }
    return out;
  };
  std::vector<RankTrace> dumps = {dump(0, 4, records(0, 6 * kSecond), groups(0, 3, 2)),
                                  dump(1, 4, records(-1, 0), groups(1, 2, 2)),
                                  dump(2, 4, records(0, 1 * kSecond), groups(2, 3, 2)),
                                  dump(3, 4, records(1, 5 * kSecond), groups(3, 2, 3))};
  // Rank 2's wait is the longest, but rank 3, whom it waits for, waits itself.
  EXPECT_EQ(analyse_traces(dumps).verdict,
            "rank 1 never entered collective #3 (all_gather, params, unit 2, replicas 1); the other ranks waited 5.0 s");
}

TEST(TraceAnalysis, DumpsOfAnOlderJobAreLeftOut) {
  std::vector<RankTrace> dumps = stall_at_6();
  dumps.push_back(dump(4, 5, completed(2), {}, Reason::abort, 3));  // an older job of 5 ranks
  const TraceReport report = analyse_traces(dumps);
  EXPECT_THAT(report.verdict, StartsWith("rank 2 never entered collective #6"));
  EXPECT_EQ(report.lines.back(), "note: left out 1 dump(s) of an older job: rank-4.trace");
  dumps.back().header.job = 7;  // the same job, a different world: not one job's dumps
  EXPECT_THAT(test::error_of([&] { analyse_traces(dumps); }), HasSubstr("rank-4.trace: a world of 5 ranks"));
}

TEST(TraceAnalysis, ADirectoryWithoutDumpsIsRefused) {
  const test::TempDir dir;
  EXPECT_THAT(test::error_of([&] { read_trace_dir(dir.file("none")); }), HasSubstr("none: not a directory"));
  EXPECT_THROW(read_trace_dir(dir.path().string()), UsageError);
  std::ofstream(dir.file("rank-00000.trace")) << "not a trace";
  EXPECT_THAT(test::error_of([&] { read_trace_dir(dir.path().string()); }),
              HasSubstr("rank-00000.trace: truncated: 11 bytes"));
}

}  // namespace
}  // namespace zshard
