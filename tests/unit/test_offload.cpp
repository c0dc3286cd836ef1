// --offload optimizer in one process: AdamW runs on the host's cores (two or more threads where the host
// has them; each takes a contiguous run of the segments' elements) and gives the same bits as the
// optimizer without offload, for both model families.
#include <gtest/gtest.h>

#include <thread>

#include "tests/support/training_runs.h"

namespace zshard {
namespace {

TEST(Offload, HostAdamWOnEveryCoreGivesTheSameBits) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "one hardware thread: nothing runs in parallel";
  for (const char* model : {"tiny", "llama-tiny"}) {
    TrainOptions plain = test::tiny_options(5);
    plain.model = model;
    TrainOptions offloaded = plain;
    offloaded.placement.offload_optimizer = true;
    const test::RunResult want = test::train_single_process(plain), got = test::train_single_process(offloaded);
    EXPECT_EQ(got.losses, want.losses) << model;
    EXPECT_EQ(got.grad_norms, want.grad_norms) << model;
    EXPECT_EQ(got.params, want.params) << model;
  }
}

}  // namespace
}  // namespace zshard
