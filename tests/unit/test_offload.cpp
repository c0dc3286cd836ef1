// --offload optimizer in one process: AdamW runs on the host's cores (two or more threads where the host
// has them; each takes a contiguous run of the segments' elements) and gives the same bits as the
// optimizer without offload, for both model families, with one and two micro-steps, and with the host
// gradients in buffers of their own (ZSHARD_TEST_OFFLOAD_COPIES=1: copied as on a GPU).
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "tests/support/training_runs.h"

namespace zshard {
namespace {

TEST(Offload, HostAdamWOnEveryCoreGivesTheSameBits) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "one hardware thread: nothing runs in parallel";
  for (const char* model : {"tiny", "llama-tiny"})
    for (int accum : {1, 2}) {
      TrainOptions plain = test::tiny_options(5);
      plain.model.name = model;
      plain.data.grad_accum = accum;
      const test::RunResult want = test::train_single_process(plain);
      TrainOptions offloaded = plain;
      offloaded.plan.placement.offload_optimizer = true;
      for (const bool copies : {false, true}) {
        if (copies) setenv("ZSHARD_TEST_OFFLOAD_COPIES", "1", 1);
        const test::RunResult got = test::train_single_process(offloaded);
        unsetenv("ZSHARD_TEST_OFFLOAD_COPIES");
        SCOPED_TRACE(std::string(model) + " grad-accum " + std::to_string(accum) + (copies ? " host copies" : ""));
        EXPECT_EQ(got.losses, want.losses);
        EXPECT_EQ(got.grad_norms, want.grad_norms);
        EXPECT_EQ(got.params, want.params);
      }
    }
}

}  // namespace
}  // namespace zshard
