// The flight recorder in one process: what a collective leaves in the ring (op, group, count, label,
// times, state), the ring's bound, the dump's format and the reader's refusal of a damaged dump, SIGUSR1.
// The recorder is one per process: the tests of a process share one recorded world of one rank.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

#include <zshard/error.h>

#include "comm/backend_base.h"
#include "comm/flight_recorder/recorder.h"
#include "comm/polling_work.h"
#include "comm/self_communicator.h"
#include "comm/flight_recorder/dump_file.h"
#include "tests/support/test_support.h"

namespace zshard::comm {
namespace {

using ::testing::HasSubstr;
using test::error_of;
using namespace std::chrono_literals;
using trace::Purpose;
using trace::Reason;
using trace::Record;
using trace::State;

struct Recorded {
  test::TempDir dir{"zshard-flight"};
  SelfCommunicator world;
  Recorded() {
    check_trace_dir(dir.path().string());
    start_recording(world, dir.path().string());
  }
  std::string path() const { return dir.file("rank-00000.trace"); }
  trace::RankTrace dump() const {
    dump_flight_record(Reason::request, SIGUSR1);
    return trace::read_trace(path());
  }
};

Recorded& recorded() {
  static Recorded r;
  return r;
}

const trace::GroupEntry& group_labelled(const trace::RankTrace& t, const std::string& label) {
  for (const auto& g : t.groups)
    if (label == g.label) return g;
  throw Error("no group labelled " + label);
}

TEST(FlightRecorder, RecordsEachCollectiveWithItsGroupLabelAndState) {
  Recorded& r = recorded();
  const std::unique_ptr<Communicator> shard = r.world.split(3, 0);
  set_group_label(*shard, "shard group 3");
  float x[4] = {};
  {
    const CollectiveLabel label(Purpose::params, 7);
    shard->all_gather(x, x, 4, DType::f32)->wait();
  }
  r.world.all_reduce(x, 2, DType::f32, ReduceOp::avg)->wait();
  const WorkPtr pending = r.world.broadcast(x, 1, DType::f32, 0);  // never tested: still in flight

  const trace::RankTrace t = r.dump();
  EXPECT_EQ(t.header.rank, 0);
  EXPECT_EQ(t.header.world_size, 1);
  EXPECT_EQ(Reason(t.header.reason), Reason::request);
  const trace::GroupEntry& g = group_labelled(t, "shard group 3");
  EXPECT_THAT(std::string(g.key), ::testing::MatchesRegex("world\\.[0-9]+:3"));
  EXPECT_EQ(std::string(t.groups[0].key), "world");
  ASSERT_GE(t.records.size(), 3u);
  const Record& gather = t.records[t.records.size() - 3];
  const Record& reduce = t.records[t.records.size() - 2];
  const Record& bcast = t.records.back();
  EXPECT_EQ(std::string(t.groups[size_t(gather.group)].key), g.key);
  EXPECT_EQ(Collective(gather.op), Collective::all_gather);
  EXPECT_EQ(gather.count, 4u);
  EXPECT_EQ(DType(gather.dtype), DType::f32);
  EXPECT_EQ(gather.unit, 7);
  EXPECT_EQ(Purpose(gather.purpose), Purpose::params);
  EXPECT_EQ(gather.group_seq, 1u);  // the first collective of a new group
  EXPECT_EQ(State(gather.state), State::completed);
  EXPECT_GE(gather.ended_ns, gather.issued_ns);
  // The label ended with its scope.
  EXPECT_EQ(Collective(reduce.op), Collective::all_reduce);
  EXPECT_EQ(reduce.unit, -1);
  EXPECT_EQ(Purpose(reduce.purpose), Purpose::other);
  EXPECT_EQ(ReduceOp(reduce.reduce), ReduceOp::avg);
  EXPECT_EQ(Collective(bcast.op), Collective::broadcast);
  EXPECT_EQ(bcast.root, 0);
  EXPECT_EQ(bcast.reduce, trace::kNoReduce);
  EXPECT_EQ(State(bcast.state), State::in_flight);
  EXPECT_EQ(bcast.ended_ns, 0);
  EXPECT_EQ(bcast.group_seq, reduce.group_seq + 1);  // both on the world
  EXPECT_EQ(bcast.seq, t.header.issued);
  EXPECT_EQ(describe({4, 7, -1, uint8_t(Collective::all_gather), uint8_t(DType::f32), trace::kNoReduce,
                      uint8_t(Purpose::params)}),
            "all_gather of 4 f32 (params, unit 7)");
}

TEST(FlightRecorder, TheRingKeepsTheNewestCollectives) {
  Recorded& r = recorded();
  double v = 0;
  for (int i = 0; i < kTraceRingCapacity + 10; ++i) r.world.all_reduce(&v, 1, DType::f64, ReduceOp::sum)->wait();
  const trace::RankTrace t = r.dump();
  ASSERT_EQ(t.records.size(), size_t(kTraceRingCapacity));
  EXPECT_EQ(t.records.front().seq, t.header.issued - kTraceRingCapacity + 1);
  for (size_t i = 1; i < t.records.size(); ++i) EXPECT_EQ(t.records[i].seq, t.records[i - 1].seq + 1);
}

// Never completes; its poll throws when told to.
class StuckWork final : public PollingWork {
 public:
  explicit StuckWork(bool throws) : PollingWork(nullptr), throws_(throws) {}

 private:
  bool poll() override {
    if (throws_) throw Error("the transport broke");
    return false;
  }
  bool throws_;
};

TEST(FlightRecorder, TimedOutAndFailedCollectivesKeepTheirState) {
  Recorded& r = recorded();
  StuckWork late(false), broken(true);
  late.set_trace(record_issue(trace_group_of(r.world), Collective::all_gather, 9, DType::bf16, -1, -1));
  broken.set_trace(record_issue(trace_group_of(r.world), Collective::reduce_scatter, 9, DType::f32, 0, -1));
  EXPECT_THROW(late.wait(Clock::now() + 10ms), Error);
  EXPECT_THROW(broken.test(), Error);
  const trace::RankTrace t = r.dump();
  ASSERT_GE(t.records.size(), 2u);
  EXPECT_EQ(State(t.records[t.records.size() - 2].state), State::timed_out);
  EXPECT_GE(t.records[t.records.size() - 2].ended_ns - t.records[t.records.size() - 2].issued_ns, 10'000'000);
  EXPECT_EQ(State(t.records.back().state), State::failed);
  // A wait marks its collective as waited for until it ends.
  StuckWork stuck(false);
  stuck.set_trace(record_issue(trace_group_of(r.world), Collective::broadcast, 1, DType::f32, -1, 0));
  EXPECT_EQ(State(r.dump().records.back().state), State::in_flight);
  record_waiting(r.dump().records.back().seq);
  EXPECT_EQ(State(r.dump().records.back().state), State::waiting);
}

// A process stopped (SIGSTOP) and continued 1.5 s later shows the pause in its dump.
TEST(FlightRecorder, AStoppedProcessShowsItsPause) {
  Recorded& r = recorded();
  std::this_thread::sleep_for(300ms);  // the ticker's first notes
  EXPECT_LT(r.dump().header.paused_ns, 1'000'000'000);
  const pid_t self = ::getpid();
  const pid_t waker = ::fork();
  ASSERT_GE(waker, 0);
  if (waker == 0) {
    ::usleep(1'500'000);
    ::kill(self, SIGCONT);
    ::_exit(0);
  }
  std::raise(SIGSTOP);
  ::waitpid(waker, nullptr, 0);
  const trace::RankTrace t = r.dump();
  EXPECT_GE(t.header.paused_ns, 1'400'000'000);
  EXPECT_LT(t.header.paused_ago_ns, 1'000'000'000);
}

TEST(FlightRecorder, Sigusr1DumpsAndTheProcessGoesOn) {
  Recorded& r = recorded();
  std::filesystem::remove(r.path());
  ASSERT_EQ(std::raise(SIGUSR1), 0);
  const trace::RankTrace t = trace::read_trace(r.path());
  EXPECT_EQ(Reason(t.header.reason), Reason::request);
  EXPECT_EQ(t.header.signal, SIGUSR1);
  EXPECT_FALSE(std::filesystem::exists(r.path() + ".tmp"));
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Each damage is refused in one line naming the file and the part.
TEST(FlightRecorder, DamagedDumpsAreRefusedNamingThePart) {
  Recorded& r = recorded();
  double v = 0;
  for (int i = 0; i < 3; ++i) r.world.all_reduce(&v, 1, DType::f64, ReduceOp::sum)->wait();
  r.dump();
  const std::string good = bytes_of(r.path());
  const std::string bad = r.dir.file("damaged.trace");
  const auto read_after = [&](const std::function<void(std::string&)>& damage) {
    std::string b = good;
    damage(b);
    std::ofstream(bad, std::ios::binary | std::ios::trunc) << b;
    return error_of([&] { trace::read_trace(bad); });
  };
  trace::FileHeader h;
  std::memcpy(&h, good.data(), sizeof h);
  const size_t records_at = sizeof h + h.group_count * sizeof(trace::GroupEntry);
  ASSERT_GT(h.record_count, 2u);
  EXPECT_THAT(read_after([](std::string&) {}), "(no error)");
  EXPECT_THAT(read_after([](std::string& b) { b.resize(b.size() - 10); }),
              HasSubstr(bad + ": truncated: " + std::to_string(good.size() - 10) + " bytes, the header counts "));
  EXPECT_THAT(read_after([](std::string& b) { b.resize(100); }), HasSubstr("shorter than the 256-byte header"));
  EXPECT_THAT(read_after([](std::string& b) { b += "extra"; }), HasSubstr("corrupt: 5 bytes past the"));
  EXPECT_THAT(read_after([](std::string& b) { b[0] = 'X'; }), HasSubstr("not a zshard trace (bad magic)"));
  EXPECT_THAT(read_after([](std::string& b) { b[offsetof(trace::FileHeader, world_size)] ^= 4; }),
              HasSubstr("corrupt: the header fails its checksum"));
  EXPECT_THAT(read_after([&](std::string& b) { b[records_at + sizeof(Record) + 8] ^= 1; }),
              HasSubstr("corrupt: record 1 fails its checksum"));
  // Sealed again after the change: the checksum holds, the values cannot.
  EXPECT_THAT(read_after([&](std::string& b) {
                Record rec;
                std::memcpy(&rec, b.data() + records_at, sizeof rec);
                rec.op = 9;
                trace::seal(rec);
                std::memcpy(b.data() + records_at, &rec, sizeof rec);
              }),
              HasSubstr("corrupt: impossible values in record 0"));
  EXPECT_THAT(read_after([&](std::string& b) {
                trace::FileHeader v = h;
                v.version = 2;
                trace::seal(v);
                std::memcpy(b.data(), &v, sizeof v);
              }),
              HasSubstr("trace format version 2, this zshard reads version 1"));
  EXPECT_THAT(error_of([&] { trace::read_trace(r.dir.file("none.trace")); }), HasSubstr("cannot open"));
}

TEST(FlightRecorder, ATraceDirThatCannotBeWrittenIsRefused) {
  const test::TempDir dir;
  std::ofstream(dir.file("file")) << "x";
  EXPECT_THAT(error_of([&] { check_trace_dir(dir.file("file") + "/traces"); }),
              HasSubstr("--trace-dir " + dir.file("file") + "/traces: cannot create the directory"));
  EXPECT_THROW(check_trace_dir(dir.file("file")), UsageError);
  check_trace_dir(dir.file("a/b"));  // made, with its parents
  EXPECT_TRUE(std::filesystem::is_directory(dir.file("a/b")));
  EXPECT_TRUE(std::filesystem::is_empty(dir.file("a/b")));  // the probe is gone
}

}  // namespace
}  // namespace zshard::comm
