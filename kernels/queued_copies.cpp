#include "kernels/queued_copies.h"

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <string_view>
#include <thread>
#include <vector>

#include <zshard/error.h>

namespace zshard {

namespace {

class QueuedCopies final : public CopyStream {
 public:
  QueuedCopies(int marks, bool threaded, uint32_t seed)
      : marks_(size_t(marks), 0), threaded_(threaded), rng_(seed) {
    const char* skip = std::getenv("ZSHARD_TEST_COPY_STREAM_SKIP_WAIT");
    skipped_wait_ = skip && *skip ? std::atol(skip) : 0;
    if (threaded_) worker_ = std::thread([this] { work(); });
  }

  // Whatever is still queued runs before the buffers it reads and writes go.
  ~QueuedCopies() override {
    std::unique_lock lock(mutex_);
    stopping_ = true;
    changed_.notify_all();
    if (threaded_) {
      lock.unlock();
      worker_.join();
      return;
    }
    while (!queue_.empty()) run_front(lock);
  }

  void follow_compute() override {}  // the host computes: what it queued before is done

  void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) override {
    ZS_CHECK(dst_device == Device::cpu && src_device == Device::cpu, "the queued test copy stream is for the cpu");
    std::lock_guard lock(mutex_);
    queue_.push_back({dst, src, bytes});
    ++queued_;
    changed_.notify_all();
  }

  void set_mark(int i) override {
    std::lock_guard lock(mutex_);
    mark(i) = queued_;
  }
  void host_waits(int i) override { wait_for(i); }
  void compute_waits(int i) override { wait_for(i); }

 private:
  struct Copy {
    void* dst;
    const void* src;
    size_t bytes;
  };

  uint64_t& mark(int i) {
    ZS_CHECK(i >= 0 && size_t(i) < marks_.size(), "CopyStream: no mark ", i);
    return marks_[size_t(i)];
  }

  void wait_for(int i) {
    std::unique_lock lock(mutex_);
    const uint64_t target = mark(i);
    if (++waits_ == skipped_wait_) return;
    if (threaded_) {
      changed_.wait(lock, [&] { return done_ >= target; });
      return;
    }
    while (done_ < target) run_front(lock);
  }

  // Takes the oldest copy off the queue and runs it with the lock released.
  void run_front(std::unique_lock<std::mutex>& lock) {
    const Copy c = queue_.front();
    queue_.pop_front();
    lock.unlock();
    if (c.dst != c.src) std::memcpy(c.dst, c.src, c.bytes);
    lock.lock();
    ++done_;
    changed_.notify_all();
  }

  void work() {
    std::unique_lock lock(mutex_);
    for (;;) {
      changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      const auto pause = std::chrono::microseconds(std::uniform_int_distribution<int>(0, 1000)(rng_));
      lock.unlock();
      std::this_thread::sleep_for(pause);
      lock.lock();
      run_front(lock);
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Copy> queue_;
  uint64_t queued_ = 0, done_ = 0;  // copies queued and finished so far, in queue order
  std::vector<uint64_t> marks_;     // mark i is reached once done_ reaches it
  bool stopping_ = false;
  long waits_ = 0, skipped_wait_;  // host_waits and compute_waits so far; the one skipped (0: none)
  bool threaded_;
  std::mt19937 rng_;
  std::thread worker_;  // last: it starts once everything above is set
};

}  // namespace

std::unique_ptr<CopyStream> make_test_copy_stream(int marks) {
  const char* value = std::getenv("ZSHARD_TEST_COPY_STREAM");
  const std::string_view mode = value ? value : "";
  if (mode.empty()) return nullptr;
  if (mode == "lazy") return std::make_unique<QueuedCopies>(marks, false, 0);
  if (mode == "async") return std::make_unique<QueuedCopies>(marks, true, 1);
  if (mode.substr(0, 6) == "async:")
    return std::make_unique<QueuedCopies>(marks, true, uint32_t(std::strtoul(value + 6, nullptr, 10)));
  fail("ZSHARD_TEST_COPY_STREAM must be async, async:SEED or lazy, got '", mode, "'");
}

}  // namespace zshard
