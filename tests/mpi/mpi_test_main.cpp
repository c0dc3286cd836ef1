// gtest main for tests that run under mpirun: every rank runs every test; the job fails if any rank fails.
#include <gtest/gtest.h>

#include "comm/launch.h"
#include "tests/support/test_support.h"

int main(int argc, char** argv) {
  auto world = zshard::comm::init_world(&argc, &argv);
  zshard::test::set_world(world.get());
  ::testing::InitGoogleTest(&argc, argv);
  // Only rank 0 prints progress; failures are printed by the rank that sees them.
  if (world->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
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
