// gtest main for tests that run under mpirun: every rank runs every test; the job fails if any rank fails.
#include <gtest/gtest.h>

#include <cstdio>

#include "comm/launch.h"
#include "tests/support/test_support.h"

namespace {
// What a rank other than 0 prints: only its failures, each marked with the rank, so that a failure seen
// on one rank alone is not silent behind rank 0's "another rank failed".
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
              r.message());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  auto world = zshard::comm::init_world(&argc, &argv);
  zshard::test::set_world(world.get());
  ::testing::InitGoogleTest(&argc, argv);
  // Only rank 0 prints progress; failures are printed by the rank that sees them.
  if (world->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(world->rank()));
  }
  int failed = RUN_ALL_TESTS();
  double any_failed = failed ? 1.0 : 0.0;
  zshard::comm::all_reduce_sum(*world, &any_failed, 1);
  if (any_failed > 0 && failed == 0 && world->rank() == 0)
    fprintf(stderr, "another rank failed\n");
  world.reset();
  zshard::comm::finalize_world();
  return any_failed > 0 ? 1 : 0;
}
