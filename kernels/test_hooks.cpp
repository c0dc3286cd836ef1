#include "kernels/test_hooks.h"

#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

#include <zshard/error.h>

namespace zshard {

namespace {

// One hook's value cut at its colons, read field by field as its format says. Whatever does not fit the
// format fails with the one message every hook shares.
class HookValue {
 public:
  HookValue(const char* name, const char* format, std::string value)
      : name_(name), format_(format), value_(std::move(value)) {
    size_t begin = 0;
    for (size_t colon; (colon = value_.find(':', begin)) != std::string::npos; begin = colon + 1)
      fields_.push_back(value_.substr(begin, colon - begin));
    fields_.push_back(value_.substr(begin));
  }

  // Fails unless the value has from `least` to `most` fields.
  const HookValue& fields(size_t least, size_t most) const {
    if (fields_.size() < least || fields_.size() > most) malformed();
    return *this;
  }
  bool has(size_t i) const { return i < fields_.size(); }

  template <class Int>
  Int whole(size_t i, Int most = std::numeric_limits<Int>::max()) const {
    const std::string& f = fields_.at(i);
    Int n = 0;
    const auto [end, error] = std::from_chars(f.data(), f.data() + f.size(), n);
    if (error != std::errc() || end != f.data() + f.size() || f.front() == '-' || n > most) malformed();
    return n;
  }
  int rank(size_t i) const { return whole<int>(i); }

  double factor(size_t i) const {
    const std::string& f = fields_.at(i);
    double x = 0;
    const auto [end, error] = std::from_chars(f.data(), f.data() + f.size(), x);
    if (error != std::errc() || end != f.data() + f.size() || !(x > 0) || !std::isfinite(x)) malformed();
    return x;
  }

  bool on_off(size_t i) const { return whole<int>(i, 1) == 1; }

  const std::string& word(size_t i) const { return fields_.at(i); }

  [[noreturn]] void malformed() const { fail(name_, "='", value_, "' is malformed: expected ", format_); }

 private:
  const char* name_;
  const char* format_;
  std::string value_;
  std::vector<std::string> fields_;
};

// The value of hook `name`, or nothing when it is unset or empty (off).
std::optional<HookValue> hook(const char* name, const char* format) {
  const char* value = std::getenv(name);
  if (!value || !*value) return std::nullopt;
  return HookValue(name, format, value);
}

TestHooks read_environment() {
  TestHooks h;
  if (const auto v = hook("ZSHARD_TEST_SLOW_RANK", "RANK:FACTOR"))
    h.slow_rank = {v->fields(2, 2).rank(0), v->factor(1)};
  if (const auto v = hook("ZSHARD_TEST_FAIL_RANK", "RANK:STEP"))
    h.fail_rank = {v->fields(2, 2).rank(0), v->whole<int>(1)};
  if (const auto v = hook("ZSHARD_TEST_NAN_STEP", "STEP")) h.nan_step = v->fields(1, 1).whole<int>(0);
  if (const auto v = hook("ZSHARD_TEST_STALL_SET_UP", "RANK[:MS[:plan|engine]]")) {
    constexpr int64_t kAnHour = 3'600'000;
    const std::string where = v->fields(1, 3).has(2) ? v->word(2) : "plan";
    if (where != "plan" && where != "engine") v->malformed();
    h.stall_set_up = {v->rank(0), v->has(1) ? v->whole<int64_t>(1) : kAnHour, where};
  }
  if (const auto v = hook("ZSHARD_TEST_SKIP_GATHER", "RANK:UNIT"))
    h.skip_gather = {v->fields(2, 2).rank(0), v->whole<int>(1)};
  if (const auto v = hook("ZSHARD_TEST_COPY_STREAM", "async[:SEED]|lazy")) {
    v->fields(1, 2);
    if (v->word(0) == "lazy" && !v->has(1)) h.copy_stream = {false, 0};
    else if (v->word(0) == "async") h.copy_stream = {true, v->has(1) ? v->whole<uint32_t>(1) : 1};
    else v->malformed();
  }
  if (const auto v = hook("ZSHARD_TEST_COPY_STREAM_SKIP_WAIT", "N"))
    h.copy_stream_skip_wait = v->fields(1, 1).whole<int64_t>(0);
  if (const auto v = hook("ZSHARD_TEST_OFFLOAD_COPIES", "0|1")) h.offload_copies = v->fields(1, 1).on_off(0);
  if (const auto v = hook("ZSHARD_TEST_SLOW_WRITER", "MS")) h.slow_writer_ms = v->fields(1, 1).whole<int64_t>(0);
  if (const auto v = hook("ZSHARD_TEST_SLOW_SLICES", "MS")) h.slow_slices_ms = v->fields(1, 1).whole<int64_t>(0);
  if (const auto v = hook("ZSHARD_TEST_PAUSE_IN_SAVE", "MS"))
    h.pause_in_save_ms = v->fields(1, 1).whole<int64_t>(0);
  if (const auto v = hook("ZSHARD_TEST_COUNT_DEVICE_WAITS", "0|1"))
    h.count_device_waits = v->fields(1, 1).on_off(0);
  if (const auto v = hook("ZSHARD_POLL_BACKOFF", "0|1")) h.poll_backoff = v->fields(1, 1).on_off(0);
  return h;
}

TestHooks& stored() {
  static TestHooks hooks = read_environment();
  return hooks;
}

// Atomic: a wait may come from any thread.
std::atomic<int64_t> device_waits{0};

}  // namespace

const TestHooks& test_hooks() { return stored(); }

int64_t device_waits_counted() { return device_waits.load(); }

void count_device_wait() {
  if (stored().count_device_waits) device_waits.fetch_add(1);
}

void reload_test_hooks() { stored() = read_environment(); }

}  // namespace zshard
