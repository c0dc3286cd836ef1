// zshard-test-np: 1 2 3 4
// The communicator under mpirun, host buffers: every collective against values known in closed form
// (collective_checks.h).
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <zshard/communicator.h>
#include <zshard/error.h>

#include "comm/agreed_failure.h"
#include "tests/mpi/collective_checks.h"
#include "tests/support/test_support.h"

namespace zshard::comm {
namespace {

using namespace std::chrono_literals;
using test::world;
using namespace test_checks;

template <class T>
class Collectives : public ::testing::Test {};
using Elements = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Collectives, Elements);

TYPED_TEST(Collectives, AllGather) {
  for (size_t count : kCounts)
    for (bool in_place : {false, true})
      check_all_gather<TypeParam>(world(), all_ranks(world().size()), count, in_place);
}

TYPED_TEST(Collectives, ReduceScatter) {
  for (size_t count : kCounts)
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg})
      for (bool in_place : {false, true})
        check_reduce_scatter<TypeParam>(world(), all_ranks(world().size()), count, op, in_place);
}

TYPED_TEST(Collectives, AllReduce) {
  for (size_t count : kCounts)
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg})
      check_all_reduce<TypeParam>(world(), all_ranks(world().size()), count, op);
}

TYPED_TEST(Collectives, BroadcastFromEveryRoot) {
  for (size_t count : kCounts)
    for (int root = 0; root < world().size(); ++root)
      check_broadcast<TypeParam>(world(), all_ranks(world().size()), count, root);
}

TYPED_TEST(Collectives, AllToAll) {
  for (size_t count : kCounts) check_all_to_all<TypeParam>(world(), all_ranks(world().size()), count);
}

TEST(Communicator, IsMpiWithTheLaunchedWorld) {
  EXPECT_EQ(world().backend(), "mpi");
  EXPECT_GE(world().rank(), 0);
  EXPECT_LT(world().rank(), world().size());
  world().barrier();
}

// Sub-groups as hybrid sharding makes them: by parity, by consecutive pairs, and all ranks in reverse.
TEST(Communicator, SplitGroupsRunCollectivesWithinThemselves) {
  const int n = world().size(), me = world().rank();
  struct Scheme {
    const char* name;
    int color, key;
    std::vector<int> members;
  };
  std::vector<Scheme> schemes = {
      {"parity", me % 2, me, {}}, {"pairs", me / 2, me, {}}, {"reversed", 0, -me, {}}};
  for (int r = 0; r < n; ++r) {
    if (r % 2 == me % 2) schemes[0].members.push_back(r);
    if (r / 2 == me / 2) schemes[1].members.push_back(r);
    schemes[2].members.insert(schemes[2].members.begin(), r);
  }
  for (const auto& s : schemes) {
    SCOPED_TRACE(s.name);
    auto group = world().split(s.color, s.key);
    ASSERT_EQ(group->size(), int(s.members.size()));
    ASSERT_EQ(s.members[group->rank()], me);
    EXPECT_EQ(group->timeout(), world().timeout());
    for (bool in_place : {false, true}) check_all_gather<float>(*group, s.members, 1000, in_place);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      check_reduce_scatter<double>(*group, s.members, 7, op, false);
      check_all_reduce<float>(*group, s.members, 1000, op);
    }
    for (int root = 0; root < group->size(); ++root) check_broadcast<double>(*group, s.members, 7, root);
    check_all_to_all<float>(*group, s.members, 1000);
    group->barrier();
  }
}

TEST(Communicator, OpsInFlightTogetherWaitedInReverseOrder) {
  auto& comm = world();
  const int n = comm.size(), me = comm.rank();
  auto sum = contribution<double>(me, 1000);
  auto mine = contribution<float>(me, 5);
  std::vector<float> gathered(n * 5);
  auto scatter_in = contribution<double>(me, n * 7);
  std::vector<double> scattered(7);
  auto bcast = me == n - 1 ? contribution<float>(me, 33) : std::vector<float>(33, -1);
  auto avg = contribution<float>(me, 65);

  std::vector<WorkPtr> works;
  works.push_back(comm.all_reduce(sum.data(), sum.size(), DType::f64, ReduceOp::sum));
  works.push_back(comm.all_gather(mine.data(), gathered.data(), 5, DType::f32));
  works.push_back(comm.reduce_scatter(scatter_in.data(), scattered.data(), 7, DType::f64, ReduceOp::avg));
  works.push_back(comm.broadcast(bcast.data(), bcast.size(), DType::f32, n - 1));
  works.push_back(comm.all_reduce(avg.data(), avg.size(), DType::f32, ReduceOp::avg));
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  for (auto& work : works) EXPECT_TRUE(work->test());

  auto reduced = [n](size_t i) {
    double s = 0;
    for (int r = 0; r < n; ++r) s += value(r, i);
    return s;
  };
  expect_all(sum, reduced, 0, "all_reduce sum");
  expect_all(gathered, [](size_t k) { return value(int(k / 5), k % 5); }, 0, "all_gather");
  expect_all(scattered, [&](size_t i) { return reduced(me * 7 + i) / n; }, 1e-15, "reduce_scatter avg");
  expect_all(bcast, [n](size_t i) { return value(n - 1, i); }, 0, "broadcast");
  expect_all(avg, [&](size_t i) { return reduced(i) / n; }, 1e-6, "all_reduce avg");
}

TEST(Communicator, TestBecomesTrueWithoutWait) {
  auto& comm = world();
  auto buf = contribution<double>(comm.rank(), (1 << 16) + 3);
  auto work = comm.all_reduce(buf.data(), buf.size(), DType::f64, ReduceOp::sum);
  const auto guard = Clock::now() + 60s;
  while (!work->test()) {
    ASSERT_LT(Clock::now(), guard) << "test() still false after 60 s";
    std::this_thread::yield();
  }
  EXPECT_TRUE(work->test());
  expect_all(buf, [&](size_t i) {
    double s = 0;
    for (int r = 0; r < comm.size(); ++r) s += value(r, i);
    return s;
  }, 0, "all_reduce polled with test()");
}

TEST(Communicator, StatsCountBusBytes) {
  const CommStats world_before = world().stats();
  auto comm = world().split(0, world().rank());  // a fresh communicator, with its own stats
  const int64_t n = comm->size(), k = 1000, bytes = k * 4;
  auto buf = contribution<float>(0, n * k);
  std::vector<float> out(n * k);
  comm->all_gather(buf.data(), out.data(), k, DType::f32)->wait();
  comm->reduce_scatter(buf.data(), out.data(), k, DType::f32, ReduceOp::sum)->wait();
  comm->all_reduce(buf.data(), k, DType::f32, ReduceOp::avg)->wait();
  comm->all_reduce(buf.data(), k, DType::f32, ReduceOp::sum)->wait();
  comm->broadcast(buf.data(), k, DType::f32, 0)->wait();

  const auto& stats = comm->stats();
  const int64_t gathered = (n - 1) * bytes, reduced = 2 * (n - 1) * bytes / n, broadcast = n > 1 ? bytes : 0;
  EXPECT_EQ(stats.bytes[int(Collective::all_gather)], gathered);
  EXPECT_EQ(stats.bytes[int(Collective::reduce_scatter)], gathered);
  EXPECT_EQ(stats.bytes[int(Collective::all_reduce)], 2 * reduced);
  EXPECT_EQ(stats.bytes[int(Collective::broadcast)], broadcast);
  EXPECT_EQ(stats.total_bytes(), 2 * gathered + 2 * reduced + broadcast);
  EXPECT_EQ(stats.calls[int(Collective::all_gather)], 1);
  EXPECT_EQ(stats.calls[int(Collective::reduce_scatter)], 1);
  EXPECT_EQ(stats.calls[int(Collective::all_reduce)], 2);
  EXPECT_EQ(stats.calls[int(Collective::broadcast)], 1);
  EXPECT_GT(stats.seconds_waiting, 0.0);
  EXPECT_EQ(world().stats().calls, world_before.calls);

  comm->reset_stats();
  EXPECT_EQ(comm->stats().total_bytes(), 0);
}

// An all-to-all moves (n-1)/n of its buffer, as an all-gather of the same buffer does, and refuses to run
// in place, before anything is issued.
TEST(Communicator, AllToAllCountsBusBytesAndIsNotInPlace) {
  auto comm = world().split(0, world().rank());
  const int64_t n = comm->size(), k = 1000;
  auto buf = contribution<float>(0, n * k);
  std::vector<float> out(n * k);
  comm->all_to_all(buf.data(), out.data(), k, DType::f32)->wait();
  EXPECT_EQ(comm->stats().bytes[int(Collective::all_to_all)], (n - 1) * k * 4);
  EXPECT_EQ(comm->stats().calls[int(Collective::all_to_all)], 1);
  const std::string error = test::error_of([&] { comm->all_to_all(buf.data(), buf.data(), k, DType::f32); });
  const std::string want = "all_to_all of 1000 f32 elements on rank " + std::to_string(comm->rank()) + " of " +
                           std::to_string(n) + " (mpi): send and recv must be distinct buffers";
  EXPECT_TRUE(error.ends_with(want)) << error;
}

// Every two-byte type moves as opaque words; u16 and f16 do not reduce (bf16 does: below).
TEST(Communicator, TwoByteTypesMoveButDoNotReduce) {
  auto& comm = world();
  const int n = comm.size(), me = comm.rank();
  for (DType dtype : {DType::u16, DType::bf16, DType::f16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    std::vector<uint16_t> mine(5), gathered(n * 5);
    // The last word has its top bit set: nothing may treat the words as signed or as numbers.
    auto word = [](int rank, int i) { return uint16_t(1000 * rank + i + (i == 4 ? 60000 : 0)); };
    for (int i = 0; i < 5; ++i) mine[i] = word(me, i);
    comm.all_gather(mine.data(), gathered.data(), 5, dtype)->wait();
    for (int k = 0; k < n * 5; ++k) EXPECT_EQ(gathered[k], word(k / 5, k % 5));
    std::vector<uint16_t> bcast(3, uint16_t(me == 0 ? 0xBEEF : 0));
    comm.broadcast(bcast.data(), 3, dtype, 0)->wait();
    EXPECT_EQ(bcast, std::vector<uint16_t>(3, 0xBEEF));
    if (dtype == DType::bf16) continue;
    // Rejected before anything is issued, on every rank alike, so the ranks stay in step.
    EXPECT_THROW(comm.all_reduce(mine.data(), 5, dtype, ReduceOp::sum), Error);
    EXPECT_THROW(comm.reduce_scatter(gathered.data(), mine.data(), 5, dtype, ReduceOp::sum), Error);
  }
}

// bf16 sums, each step of the sum in fp32 and rounded once (as NCCL's): values whose sums bf16 holds
// exactly come out exact, in all-reduce and in reduce-scatter, in place and out of place; with two ranks
// 1 + 2^-9 is half a bf16 ulp above 1, a tie, rounded to even: 1. avg is refused (MPI has no average; the
// division is for f32 and f64).
TEST(Communicator, Bf16SumsStepByStepInFp32) {
  auto& comm = world();
  const int n = comm.size(), me = comm.rank();
  std::vector<bf16> mine(6), gathered(size_t(n) * 6), out(6);
  for (int i = 0; i < 6; ++i) mine[i] = bf16(float(me + 1) * float(i - 2));
  std::vector<bf16> sum = mine;
  comm.all_reduce(sum.data(), 6, DType::bf16, ReduceOp::sum)->wait();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(float(sum[i]), float(n * (n + 1) / 2) * float(i - 2)) << i;
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < 6; ++i) gathered[size_t(r) * 6 + i] = bf16(float(me + 1) * float(r + i));
  comm.reduce_scatter(gathered.data(), out.data(), 6, DType::bf16, ReduceOp::sum)->wait();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(float(out[i]), float(n * (n + 1) / 2) * float(me + i)) << i;
  comm.reduce_scatter(gathered.data(), gathered.data(), 6, DType::bf16, ReduceOp::sum)->wait();  // in place
  for (int i = 0; i < 6; ++i) EXPECT_EQ(float(gathered[i]), float(n * (n + 1) / 2) * float(me + i)) << i;
  std::vector<bf16> tiny{bf16(me == 0 ? 1.0f : 0x1p-9f)};
  comm.all_reduce(tiny.data(), 1, DType::bf16, ReduceOp::sum)->wait();
  if (n == 2) EXPECT_EQ(float(tiny[0]), 1.0f) << "1 + 2^-9 is a tie: to even";
  EXPECT_THROW(comm.all_reduce(sum.data(), 6, DType::bf16, ReduceOp::avg), Error);
}

TEST(Communicator, IntegersSumButDoNotAverage) {
  auto& comm = world();
  std::vector<int32_t> buf{comm.rank() + 1, -2, 1 << 20};
  comm.all_reduce(buf.data(), 3, DType::i32, ReduceOp::sum)->wait();
  const int n = comm.size();
  EXPECT_EQ(buf, (std::vector<int32_t>{n * (n + 1) / 2, -2 * n, n << 20}));
  try {
    comm.all_reduce(buf.data(), 3, DType::i32, ReduceOp::avg);
    ADD_FAILURE() << "avg of i32 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("avg needs f32 or f64"), std::string::npos) << e.what();
  }
}

TEST(Communicator, RejectsCountsAboveIntMax) {
  float dummy[1] = {0};  // never touched: the count is checked first
  const size_t too_many = size_t(INT_MAX) + 1;
  try {
    world().all_reduce(dummy, too_many, DType::f32, ReduceOp::sum);
    ADD_FAILURE() << "count above INT_MAX accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at most 2147483647 elements"), std::string::npos) << e.what();
  }
  EXPECT_THROW(world().all_gather(dummy, dummy, too_many, DType::f32), Error);
  EXPECT_THROW(world().broadcast(dummy, too_many, DType::f32, 0), Error);
}

TEST(Communicator, RejectsBadRootAndColor) {
  float x = 0;
  EXPECT_THROW(world().broadcast(&x, 1, DType::f32, world().size()), Error);
  EXPECT_THROW(world().broadcast(&x, 1, DType::f32, -1), Error);
  EXPECT_THROW(world().split(-1, 0), Error);
}

// A deadline that passes while peers are late. The peers join only after rank 0's wait has timed out: they
// first wait for a go from rank 0 on another communicator, so the timeout is certain. The collective is
// then matched and completes; a collective that peers never join could not be cleaned up in MPI (no
// cancel), which is why the never-completes case is tested with a fake Work in the unit tests.
// An agreement reached inside another's set-up holds on every rank as it stands: the outer one passes it on
// with its code, and the failing rank alone reports.
TEST(Agreement, AnAgreedFailureInsideAnotherPassesThrough) {
  auto& w = world();
  const int failing = w.size() - 1;
  try {
    run_agreed(w, [&] {
      run_agreed(w, [&] {
        if (w.rank() == failing) throw UsageError("a bad value here");
      });
    });
    ADD_FAILURE() << "no failure came out";
  } catch (const AgreedFailure& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_EQ(e.report(), w.rank() == failing);
    EXPECT_STREQ(e.what(), w.rank() == failing ? "a bad value here" : "another rank failed");
  }
}

TEST(Communicator, WaitThrowsAtItsDeadlineWhilePeersAreLate) {
  auto& w = world();
  if (w.size() < 2) GTEST_SKIP() << "needs a peer";
  auto late = w.split(0, w.rank());
  auto signal = w.split(0, w.rank());
  late->set_timeout(60s);
  signal->set_timeout(60s);
  std::vector<double> x(3, 1.0);
  int32_t go = 0;
  if (w.rank() == 0) {
    auto work = late->all_reduce(x.data(), 3, DType::f64, ReduceOp::sum);
    const auto begin = Clock::now();
    try {
      work->wait(begin + 100ms);
      ADD_FAILURE() << "wait() returned before the peers issued the collective";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("all_reduce of 3 f64 elements (sum) on rank 0"), std::string::npos) << message;
      EXPECT_NE(message.find("timed out"), std::string::npos) << message;
    }
    EXPECT_GE(Clock::now() - begin, 100ms);
    EXPECT_GE(late->stats().seconds_waiting, 0.1);
    EXPECT_FALSE(work->test());
    go = 1;
    signal->broadcast(&go, 1, DType::i32, 0)->wait();
    work->wait();
  } else {
    signal->broadcast(&go, 1, DType::i32, 0)->wait();
    EXPECT_EQ(go, 1);
    late->all_reduce(x.data(), 3, DType::f64, ReduceOp::sum)->wait();
  }
  EXPECT_EQ(x, std::vector<double>(3, double(w.size())));
}

}  // namespace
}  // namespace zshard::comm
