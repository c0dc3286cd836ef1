// Under hybrid sharding a rank issues collectives on two communicators, its shard group and its replica
// group. NCCL can deadlock when ranks issue collectives of two communicators in different orders, so the
// order a rank issues them in must not depend on when it happens to see a collective finish. Here a
// scripted world of four ranks (this process is rank 0) completes each operation at a random moment,
// and the order of the collectives a training step issues must be the same whatever the seed.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <zshard/communicator.h>

#include "tests/support/training_runs.h"

namespace zshard {
namespace {

using comm::Collective;
using comm::WorkPtr;

struct Script {
  std::mt19937 rng;
  std::vector<std::string> issued;  // "group collective count", in issue order
};

class ScriptedWork final : public comm::Work {
 public:
  explicit ScriptedWork(Script& script) : script_(script) {}
  bool test() override { return done_ = done_ || std::bernoulli_distribution(0.3)(script_.rng); }
  void wait(comm::Clock::time_point) override { done_ = true; }

 private:
  Script& script_;
  bool done_ = false;
};

// Every rank holds what this one holds, so a collective's result follows from the local input alone.
// split() hands out the group sizes it was given, in order (StrategyGroups splits shard, then replica).
class ScriptedCommunicator final : public comm::Communicator {
 public:
  ScriptedCommunicator(std::string name, int size, std::vector<int> split_sizes, Script& script)
      : name_(std::move(name)), size_(size), split_sizes_(std::move(split_sizes)), script_(script) {}

  int rank() const override { return 0; }
  int size() const override { return size_; }
  std::string backend() const override { return "scripted"; }

  WorkPtr all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    const size_t bytes = count * dtype_size(dtype);
    for (int r = 0; r < size_; ++r) std::memmove(static_cast<char*>(recv) + r * bytes, send, bytes);
    return issue(Collective::all_gather, count);
  }
  WorkPtr reduce_scatter(const void* send, void* recv, size_t count, DType dtype, comm::ReduceOp) override {
    std::memmove(recv, send, count * dtype_size(dtype));  // block 0, as if averaged
    return issue(Collective::reduce_scatter, count);
  }
  WorkPtr all_reduce(void* buf, size_t count, DType dtype, comm::ReduceOp op) override {
    if (op == comm::ReduceOp::sum && dtype == DType::f64)  // host scalars: losses, the step's token count, ...
      for (size_t i = 0; i < count; ++i) static_cast<double*>(buf)[i] *= size_;
    return issue(Collective::all_reduce, count);
  }
  WorkPtr broadcast(void*, size_t count, DType, int) override { return issue(Collective::broadcast, count); }
  WorkPtr all_to_all(const void* send, void* recv, size_t count, DType dtype) override {
    std::memmove(recv, send, size_ * count * dtype_size(dtype));  // every rank sends what this one sends
    return issue(Collective::all_to_all, count);
  }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override {
    const int size = split_sizes_.at(next_split_);
    return std::make_unique<ScriptedCommunicator>(name_ + "/" + std::to_string(next_split_++), size,
                                                  std::vector<int>{}, script_);
  }

 private:
  WorkPtr issue(Collective c, size_t count) {
    script_.issued.push_back(name_ + " " + std::string(comm::collective_name(c)) + " " +
                             std::to_string(count));
    return std::make_unique<ScriptedWork>(script_);
  }
  std::string name_;
  int size_;
  std::vector<int> split_sizes_;
  int next_split_ = 0;
  Script& script_;
};

// The collectives of two training steps (two micro-steps each) under hybrid with groups of 2.
std::vector<std::string> issued_collectives(unsigned seed) {
  Script script{std::mt19937(seed), {}};
  ScriptedCommunicator world("world", 4, {2, 2}, script);
  TrainOptions options = test::tiny_options(2);
  options.plan.strategy = {StrategyKind::hybrid, ShardGroupRequest::equal(2), true, 2};
  options.data.grad_accum = 2;
  Trainer trainer(options, world);
  script.issued.clear();  // set-up is not timing-dependent; the steps are what is compared
  trainer.run(nullptr);
  return script.issued;
}

TEST(CollectiveOrder, HybridIssuesTheSameOrderWhateverCompletesWhen) {
  const std::vector<std::string> reference = issued_collectives(1);
  size_t all_reduces = 0;
  for (const std::string& line : reference) all_reduces += line.starts_with("world/1 all_reduce");
  ASSERT_GT(all_reduces, 0u) << "the replica group did no all-reduce: the test checks nothing";
  for (unsigned seed = 2; seed <= 6; ++seed) EXPECT_EQ(issued_collectives(seed), reference) << "seed " << seed;
}

}  // namespace
}  // namespace zshard
