// The test hooks' one format (kernels/test_hooks.h): every hook read into its fields, unset or empty as
// off, and any malformed value refused with the same message naming the hook, its value and its format.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "kernels/test_hooks.h"
#include "tests/support/test_support.h"

namespace zshard {
namespace {

// The error a reload with `name` set to `value` gives; the hook is unset again afterwards.
std::string error_with(const char* name, const char* value) {
  setenv(name, value, 1);
  const std::string error = test::error_of(reload_test_hooks);
  unsetenv(name);
  reload_test_hooks();
  return error;
}

TEST(TestHooks, OffUnlessSet) {
  const test::ScopedHook empty("ZSHARD_TEST_SLOW_WRITER", "");
  const TestHooks& h = test_hooks();
  EXPECT_FALSE(h.slow_rank || h.fail_rank || h.nan_step || h.stall_set_up || h.skip_gather || h.copy_stream ||
               h.poll_backoff);
  EXPECT_EQ(h.copy_stream_skip_wait + h.slow_writer_ms + h.slow_slices_ms + h.pause_in_save_ms, 0);
  EXPECT_FALSE(h.offload_copies);
  EXPECT_FALSE(h.count_device_waits);
}

TEST(TestHooks, EveryHookReadsItsFields) {
  {
    const test::ScopedHook slow("ZSHARD_TEST_SLOW_RANK", "1:2.5");
    const test::ScopedHook fail("ZSHARD_TEST_FAIL_RANK", "2:3");
    const test::ScopedHook nan("ZSHARD_TEST_NAN_STEP", "5");
    const test::ScopedHook gather("ZSHARD_TEST_SKIP_GATHER", "2:1");
    const TestHooks& h = test_hooks();
    ASSERT_TRUE(h.slow_rank && h.fail_rank && h.nan_step && h.skip_gather);
    EXPECT_EQ(h.slow_rank->rank, 1);
    EXPECT_EQ(h.slow_rank->factor, 2.5);
    EXPECT_EQ(h.fail_rank->rank, 2);
    EXPECT_EQ(h.fail_rank->step, 3);
    EXPECT_EQ(*h.nan_step, 5);
    EXPECT_EQ(h.skip_gather->rank, 2);
    EXPECT_EQ(h.skip_gather->unit, 1);
  }
  {
    const test::ScopedHook writer("ZSHARD_TEST_SLOW_WRITER", "3000");
    const test::ScopedHook slices("ZSHARD_TEST_SLOW_SLICES", "5");
    const test::ScopedHook pause("ZSHARD_TEST_PAUSE_IN_SAVE", "2000");
    const test::ScopedHook copies("ZSHARD_TEST_OFFLOAD_COPIES", "1");
    const test::ScopedHook skip("ZSHARD_TEST_COPY_STREAM_SKIP_WAIT", "7");
    const test::ScopedHook backoff("ZSHARD_POLL_BACKOFF", "0");
    const test::ScopedHook waits("ZSHARD_TEST_COUNT_DEVICE_WAITS", "1");
    const TestHooks& h = test_hooks();
    EXPECT_EQ(h.slow_writer_ms, 3000);
    EXPECT_EQ(h.slow_slices_ms, 5);
    EXPECT_EQ(h.pause_in_save_ms, 2000);
    EXPECT_TRUE(h.offload_copies);
    EXPECT_EQ(h.copy_stream_skip_wait, 7);
    EXPECT_EQ(h.poll_backoff, false);
    EXPECT_TRUE(h.count_device_waits);
  }
  EXPECT_EQ(test_hooks().slow_writer_ms, 0) << "the hook is off again once its scope ends";
}

TEST(TestHooks, StallAndCopyStreamDefaults) {
  {
    const test::ScopedHook stall("ZSHARD_TEST_STALL_SET_UP", "1");
    const test::ScopedHook stream("ZSHARD_TEST_COPY_STREAM", "async");
    const TestHooks& h = test_hooks();
    ASSERT_TRUE(h.stall_set_up && h.copy_stream);
    EXPECT_EQ(h.stall_set_up->ms, 3'600'000);
    EXPECT_EQ(h.stall_set_up->where, "plan");
    EXPECT_TRUE(h.copy_stream->threaded);
    EXPECT_EQ(h.copy_stream->seed, 1u);
  }
  const test::ScopedHook stall("ZSHARD_TEST_STALL_SET_UP", "1:60000:engine");
  const test::ScopedHook stream("ZSHARD_TEST_COPY_STREAM", "async:7");
  const TestHooks& h = test_hooks();
  EXPECT_EQ(h.stall_set_up->rank, 1);
  EXPECT_EQ(h.stall_set_up->ms, 60'000);
  EXPECT_EQ(h.stall_set_up->where, "engine");
  EXPECT_EQ(h.copy_stream->seed, 7u);
  const test::ScopedHook lazy("ZSHARD_TEST_COPY_STREAM", "lazy");
  EXPECT_FALSE(test_hooks().copy_stream->threaded);
}

TEST(TestHooks, AMalformedValueIsRefusedWithOneMessage) {
  const struct {
    const char *name, *value, *format;
  } cases[] = {
      {"ZSHARD_TEST_SLOW_RANK", "1", "RANK:FACTOR"},
      {"ZSHARD_TEST_SLOW_RANK", "1:0", "RANK:FACTOR"},
      {"ZSHARD_TEST_SLOW_RANK", "1:inf", "RANK:FACTOR"},
      {"ZSHARD_TEST_FAIL_RANK", "-1:3", "RANK:STEP"},
      {"ZSHARD_TEST_FAIL_RANK", "1:3:4", "RANK:STEP"},
      {"ZSHARD_TEST_NAN_STEP", "5x", "STEP"},
      {"ZSHARD_TEST_STALL_SET_UP", "1:60:later", "RANK[:MS[:plan|engine]]"},
      {"ZSHARD_TEST_STALL_SET_UP", "1:1.5", "RANK[:MS[:plan|engine]]"},
      {"ZSHARD_TEST_SKIP_GATHER", "2:", "RANK:UNIT"},
      {"ZSHARD_TEST_COPY_STREAM", "sync", "async[:SEED]|lazy"},
      {"ZSHARD_TEST_COPY_STREAM", "lazy:3", "async[:SEED]|lazy"},
      {"ZSHARD_TEST_COPY_STREAM", "async:99999999999", "async[:SEED]|lazy"},
      {"ZSHARD_TEST_COPY_STREAM_SKIP_WAIT", " 3", "N"},
      {"ZSHARD_TEST_OFFLOAD_COPIES", "yes", "0|1"},
      {"ZSHARD_TEST_SLOW_WRITER", "3s", "MS"},
      {"ZSHARD_TEST_SLOW_SLICES", "+5", "MS"},
      {"ZSHARD_TEST_PAUSE_IN_SAVE", "2.5", "MS"},
      {"ZSHARD_POLL_BACKOFF", "2", "0|1"},
      {"ZSHARD_TEST_COUNT_DEVICE_WAITS", "on", "0|1"},
  };
  for (const auto& c : cases)
    EXPECT_EQ(error_with(c.name, c.value),
              std::string(c.name) + "='" + c.value + "' is malformed: expected " + c.format);
}

TEST(TestHooks, AMalformedReloadKeepsTheHooks) {
  const test::ScopedHook writer("ZSHARD_TEST_SLOW_WRITER", "10");
  setenv("ZSHARD_TEST_SLOW_WRITER", "soon", 1);
  EXPECT_NE(test::error_of(reload_test_hooks), "(no error)");
  EXPECT_EQ(test_hooks().slow_writer_ms, 10);
}

}  // namespace
}  // namespace zshard
