// The communicator layer without MPI: the self backend, the polling Work's deadline and time accounting
// (with fake Works, since an MPI collective whose peers never join can never be cleaned up), launch
// detection, and the byte formula.
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <zshard/error.h>
#include <zshard/world.h>

#include "comm/launch.h"
#include "comm/polling_work.h"
#include "comm/self_communicator.h"
#include "tests/support/test_support.h"

namespace zshard::comm {
namespace {

using namespace std::chrono_literals;
using test::error_of;

std::vector<float> iota(size_t n, float start) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(SelfCommunicator, IsAWorldOfOne) {
  SelfCommunicator self;
  EXPECT_EQ(self.rank(), 0);
  EXPECT_EQ(self.size(), 1);
  EXPECT_EQ(self.backend(), "self");
  EXPECT_EQ(self.device(), Device::cpu);
  self.barrier();
}

// A second World (MPI would refuse to start again once the first had ended) names itself.
TEST(World, IsMadeOncePerProcess) {
  int argc = 0;
  char** argv = nullptr;
  { World first(&argc, &argv); }
  EXPECT_EQ(error_of([&] { World second(&argc, &argv); }),
            "zshard::World is made once per process (MPI cannot start again after it ends): keep one World for the "
            "whole program");
}

TEST(SelfCommunicator, CollectivesAreCopies) {
  SelfCommunicator self;
  const auto input = iota(7, 1.5f);

  std::vector<float> gathered(7, 0);
  auto work = self.all_gather(input.data(), gathered.data(), 7, DType::f32);
  EXPECT_TRUE(work->test());
  work->wait();
  EXPECT_EQ(gathered, input);

  auto in_place = input;
  self.all_gather(in_place.data(), in_place.data(), 7, DType::f32)->wait();
  EXPECT_EQ(in_place, input);

  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
    std::vector<float> reduced(7, 0);
    self.reduce_scatter(input.data(), reduced.data(), 7, DType::f32, op)->wait();
    EXPECT_EQ(reduced, input);
    auto buf = input;
    self.all_reduce(buf.data(), 7, DType::f32, op)->wait();
    EXPECT_EQ(buf, input);
  }

  auto buf = input;
  self.broadcast(buf.data(), 7, DType::f32, 0)->wait();
  EXPECT_EQ(buf, input);
  EXPECT_THROW(self.broadcast(buf.data(), 7, DType::f32, 1), Error);
}

TEST(SelfCommunicator, AllToAllIsACopy) {
  SelfCommunicator self;
  const auto input = iota(7, 1.5f);
  std::vector<float> out(7, 0);
  self.all_to_all(input.data(), out.data(), 7, DType::f32)->wait();
  EXPECT_EQ(out, input);
  EXPECT_EQ(self.stats().calls[int(Collective::all_to_all)], 1);
}

TEST(SelfCommunicator, AcceptsEveryDtype) {
  SelfCommunicator self;
  std::vector<uint16_t> words{1, 2, 3}, out(3);
  self.all_gather(words.data(), out.data(), 3, DType::bf16)->wait();
  EXPECT_EQ(out, words);
  self.all_reduce(words.data(), 3, DType::bf16, ReduceOp::avg)->wait();
  EXPECT_EQ(words, (std::vector<uint16_t>{1, 2, 3}));
}

TEST(SelfCommunicator, CountsCallsButNoBytes) {
  SelfCommunicator self;
  std::vector<double> x(1000, 1.0), y(1000);
  self.all_gather(x.data(), y.data(), 1000, DType::f64)->wait();
  self.reduce_scatter(x.data(), y.data(), 1000, DType::f64, ReduceOp::sum)->wait();
  self.all_reduce(x.data(), 1000, DType::f64, ReduceOp::sum)->wait();
  self.all_reduce(x.data(), 1000, DType::f64, ReduceOp::avg)->wait();
  self.broadcast(x.data(), 1000, DType::f64, 0)->wait();
  const auto& stats = self.stats();
  EXPECT_EQ(stats.total_bytes(), 0);
  EXPECT_EQ(stats.calls[int(Collective::all_gather)], 1);
  EXPECT_EQ(stats.calls[int(Collective::reduce_scatter)], 1);
  EXPECT_EQ(stats.calls[int(Collective::all_reduce)], 2);
  EXPECT_EQ(stats.calls[int(Collective::broadcast)], 1);
  EXPECT_GE(stats.seconds_waiting, 0.0);
  self.reset_stats();
  EXPECT_EQ(self.stats().calls[int(Collective::all_reduce)], 0);
}

TEST(SelfCommunicator, SplitGivesAnotherWorldOfOne) {
  SelfCommunicator self;
  self.set_timeout(7s);
  auto group = self.split(3, 0);
  EXPECT_EQ(group->size(), 1);
  EXPECT_EQ(group->rank(), 0);
  EXPECT_EQ(group->timeout(), Clock::duration(7s));
  EXPECT_THROW(self.split(-1, 0), Error);
}

TEST(SelfCommunicator, AllReduceSumHelper) {
  SelfCommunicator self;
  double v[2] = {1.5, -2};
  all_reduce_sum(self, v, 2);
  EXPECT_EQ(v[0], 1.5);
  EXPECT_EQ(v[1], -2);
}

TEST(BusBytes, FollowsTheNcclTestsConvention) {
  // 4 ranks, 1000 f32 per rank block: full buffer 16000 bytes for the gathers, 4000 for the others.
  EXPECT_EQ(bus_bytes(Collective::all_gather, 4, 16000), 12000);
  EXPECT_EQ(bus_bytes(Collective::reduce_scatter, 4, 16000), 12000);
  EXPECT_EQ(bus_bytes(Collective::all_reduce, 4, 4000), 6000);
  EXPECT_EQ(bus_bytes(Collective::broadcast, 4, 4000), 4000);
  EXPECT_EQ(bus_bytes(Collective::all_reduce, 3, 4000), 5333);  // floor of 2*2/3*4000
  EXPECT_EQ(bus_bytes(Collective::all_to_all, 4, 16000), 12000);
  for (int c = 0; c < kNumCollectives; ++c) EXPECT_EQ(bus_bytes(Collective(c), 1, 4000), 0);
}

// Completes on its `finish_after`-th poll (never when empty).
class FakeWork final : public PollingWork {
 public:
  FakeWork(CommStats* stats, std::optional<int> finish_after) : PollingWork(stats), left_(finish_after) {}
  int polls = 0;

 private:
  bool poll() override {
    ++polls;
    return left_ && --*left_ <= 0;
  }
  std::optional<int> left_;
};

TEST(PollingWork, WaitThrowsAtTheDeadlineNamingTheCollective) {
  CommStats stats;
  FakeWork work(&stats, std::nullopt);
  work.set_default_deadline(5min, "all_reduce of 1000 f32 elements (sum) on rank 0 of 2 (fake)");
  const auto begin = Clock::now();
  try {
    work.wait(begin + 50ms);
    FAIL() << "wait() returned for a Work that never completes";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("all_reduce of 1000 f32"), std::string::npos) << message;
    EXPECT_NE(message.find("timed out"), std::string::npos) << message;
  }
  const auto waited = Clock::now() - begin;
  EXPECT_GE(waited, 50ms);
  EXPECT_LT(waited, 5s);
  EXPECT_FALSE(work.test());
  EXPECT_GE(stats.seconds_waiting, 0.05);  // the blocked time counts even when wait() throws
}

TEST(PollingWork, DefaultWaitUsesTheTimeoutGiven) {
  FakeWork work(nullptr, std::nullopt);
  work.set_default_deadline(30ms, "broadcast of 7 f32 elements");
  const auto begin = Clock::now();
  EXPECT_THROW(work.wait(), Error);
  EXPECT_GE(Clock::now() - begin, 30ms);
}

TEST(PollingWork, WaitReturnsOnceDoneAndStopsPolling) {
  CommStats stats;
  FakeWork work(&stats, 500);  // past the spinning phase, into the sleeps
  work.wait(Clock::now() + 60s);
  EXPECT_EQ(work.polls, 500);
  EXPECT_TRUE(work.test());
  work.wait(Clock::now());  // a done Work returns even with its deadline passed
  EXPECT_EQ(work.polls, 500);
  EXPECT_GT(stats.seconds_waiting, 0.0);
}

TEST(PollingWork, TestNeverBlocks) {
  FakeWork work(nullptr, 3);
  EXPECT_FALSE(work.test());
  EXPECT_FALSE(work.test());
  EXPECT_TRUE(work.test());
  EXPECT_TRUE(work.test());
  EXPECT_EQ(work.polls, 3);
}

TEST(PollingWork, HugeTimeoutMeansNoDeadline) {
  FakeWork work(nullptr, 2);
  work.set_default_deadline(Clock::duration::max(), "all_gather");
  work.wait();
  EXPECT_TRUE(work.test());
}

// Sets or clears launcher variables for one test, restoring them after.
class LaunchEnv : public ::testing::Test {
 protected:
  static constexpr const char* kVars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID",
                                          "SLURM_NTASKS"};
  void SetUp() override {
    for (const char* var : kVars) {
      const char* value = std::getenv(var);
      saved_.emplace_back(value ? std::optional<std::string>(value) : std::nullopt);
      ::unsetenv(var);
    }
  }
  void TearDown() override {
    for (size_t i = 0; i < saved_.size(); ++i) {
      if (saved_[i]) ::setenv(kVars[i], saved_[i]->c_str(), 1);
      else ::unsetenv(kVars[i]);
    }
  }
  std::vector<std::optional<std::string>> saved_;
};

TEST_F(LaunchEnv, DetectsLaunchers) {
  EXPECT_FALSE(launched_by_mpi());
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  EXPECT_TRUE(launched_by_mpi());
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  ::setenv("PMI_SIZE", "2", 1);
  EXPECT_TRUE(launched_by_mpi());
  ::unsetenv("PMI_SIZE");
  ::setenv("PMIX_RANK", "0", 1);
  EXPECT_TRUE(launched_by_mpi());
  ::unsetenv("PMIX_RANK");
  ::setenv("SLURM_PROCID", "0", 1);
  EXPECT_FALSE(launched_by_mpi());  // both SLURM variables are needed
  ::setenv("SLURM_NTASKS", "2", 1);
  EXPECT_TRUE(launched_by_mpi());
}

TEST_F(LaunchEnv, PlainRunIsSelfWithoutMpi) {
  auto world = init_world(nullptr, nullptr);
  EXPECT_EQ(world->backend(), "self");
  EXPECT_EQ(world->size(), 1);
  world.reset();
  finalize_world();  // no MPI to finalise: a no-op
}

}  // namespace
}  // namespace zshard::comm
