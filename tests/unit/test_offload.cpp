// --offload optimizer in one process: AdamW runs on the host's cores (two or more threads where the host
// has them; each takes a contiguous run of the segments' elements) and gives the same bits as the
// optimizer without offload, for both model families, with one and two micro-steps, and with the host
// gradients in buffers of their own (ZSHARD_TEST_OFFLOAD_COPIES=1: copied as on a GPU).
//
// The copies also run as a GPU's copy stream runs them, later than they are queued (kernels/queued_copies.h):
// on a thread of their own after random pauses, or as late as a stream may run them. The offloaded
// optimizer and the batch's token copies still give the same bits, in fp32 and bf16; and the tests show
// that they depend on their waits: skipping one of them, in the deterministic late order, changes the
// results from the step where it was skipped on.
#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "tests/support/test_support.h"
#include "tests/support/training_runs.h"

namespace zshard {
namespace {

void expect_same_bits(const test::RunResult& got, const test::RunResult& want, const std::string& what) {
  EXPECT_EQ(got.losses, want.losses) << what;
  EXPECT_EQ(got.grad_norms, want.grad_norms) << what;
  EXPECT_EQ(got.params, want.params) << what;
}

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
        const test::ScopedHook own_buffers("ZSHARD_TEST_OFFLOAD_COPIES", copies ? "1" : "");
        const test::RunResult got = test::train_single_process(offloaded);
        SCOPED_TRACE(std::string(model) + " grad-accum " + std::to_string(accum) + (copies ? " host copies" : ""));
        EXPECT_EQ(got.losses, want.losses);
        EXPECT_EQ(got.grad_norms, want.grad_norms);
        EXPECT_EQ(got.params, want.params);
      }
    }
}

// Every copy stream (the offloaded optimizer's, the tokens') with its copies on a thread of their own, two
// seeds of pauses, or run only when waited for: the bits of copies done at once.
TEST(Offload, AsynchronousCopiesGiveTheSameBits) {
  const test::ScopedHook own_buffers("ZSHARD_TEST_OFFLOAD_COPIES", "1");
  for (const char* model : {"tiny", "llama-tiny"})
    for (DType dtype : {DType::f32, DType::bf16}) {
      TrainOptions plain = test::tiny_options(4);
      plain.model.name = model;
      plain.data.grad_accum = 2;
      plain.plan.placement.param_dtype = dtype;
      const test::RunResult want = test::train_single_process(plain);
      TrainOptions offloaded = plain;
      offloaded.plan.placement.offload_optimizer = true;
      expect_same_bits(test::train_single_process(offloaded), want,
                       std::string(model) + " " + std::string(dtype_name(dtype)) + " copies at once");
      for (const char* stream : {"async", "async:7", "lazy"}) {
        const test::ScopedHook queued("ZSHARD_TEST_COPY_STREAM", stream);
        const std::string what = std::string(model) + " " + std::string(dtype_name(dtype)) + " " + stream;
        expect_same_bits(test::train_single_process(offloaded), want, what + " offloaded");
        expect_same_bits(test::train_single_process(plain), want, what);
      }
    }
}

// Losses equal to the reference's before `step` (1-based), and a different one at it.
void expect_wrong_from(const test::RunResult& got, const test::RunResult& want, size_t step, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t s = 0; s + 1 < step; ++s) EXPECT_EQ(got.losses[s], want.losses[s]) << what << ": step " << s + 1;
  EXPECT_NE(got.losses[step - 1], want.losses[step - 1]) << what << ": step " << step << " should have gone wrong";
}

// The negative side: in the late order (lazy) a copy has not run until a wait asks for it, so a read that
// skips its wait reads what the buffer held before. Each stream skips its own N-th wait
// (ZSHARD_TEST_COPY_STREAM_SKIP_WAIT=N). tiny has 4 units: the optimizer's stream waits 4 times per step
// for the gradients (host_waits) and once for the uploads (compute_waits); the tokens' stream once per
// micro-step (compute_waits).
TEST(Offload, SkippingAnyOneWaitMakesTheResultsWrong) {
  const test::ScopedHook lazy("ZSHARD_TEST_COPY_STREAM", "lazy");
  const test::ScopedHook own_buffers("ZSHARD_TEST_OFFLOAD_COPIES", "1");
  TrainOptions plain = test::tiny_options(4);
  const test::RunResult want = test::train_single_process(plain);
  TrainOptions offloaded = plain;
  offloaded.plan.placement.offload_optimizer = true;
  ASSERT_EQ(test::train_single_process(offloaded).losses, want.losses);
  {
    // The tokens' 3rd wait: step 3's forward reads step 2's batch. (The optimizer's 3rd wait is skipped
    // too in this run, so it runs without the optimizer offloaded.)
    const test::ScopedHook skip("ZSHARD_TEST_COPY_STREAM_SKIP_WAIT", "3");
    expect_wrong_from(test::train_single_process(plain), want, 3, "the tokens' copy not waited for");
  }
  {
    // The optimizer's 7th wait, step 2's second unit's gradients (the tokens' stream waits only 4 times):
    // AdamW steps that unit from step 1's gradients, and step 3's loss shows it.
    const test::ScopedHook skip("ZSHARD_TEST_COPY_STREAM_SKIP_WAIT", "7");
    expect_wrong_from(test::train_single_process(offloaded), want, 3, "a unit's gradients not waited for");
  }
  {
    // The optimizer's 10th wait, step 2's uploads: step 3's forward reads step 1's parameters.
    const test::ScopedHook skip("ZSHARD_TEST_COPY_STREAM_SKIP_WAIT", "10");
    expect_wrong_from(test::train_single_process(offloaded), want, 3, "the uploads not waited for");
  }
}

}  // namespace
}  // namespace zshard
