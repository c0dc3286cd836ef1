#include "kernels/queued_copies.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <zshard/error.h>

#include "kernels/test_hooks.h"

namespace zshard {

namespace {

class QueuedCopies final : public CopyStream {
 public:
  QueuedCopies(int marks, bool threaded, uint32_t seed)
      : marks_(size_t(marks), 0),
        skipped_wait_(test_hooks().copy_stream_skip_wait),
        threaded_(threaded),
        rng_(seed) {
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
  int64_t waits_ = 0, skipped_wait_;  // host_waits and compute_waits so far; the one skipped (0: none)
  bool threaded_;
  std::mt19937 rng_;
  std::thread worker_;  // last: it starts once everything above is set
};

}  // namespace

std::unique_ptr<CopyStream> make_test_copy_stream(int marks) {
  const std::optional<TestHooks::QueuedCopyStream>& queued = test_hooks().copy_stream;
  if (!queued) return nullptr;
  return std::make_unique<QueuedCopies>(marks, queued->threaded, queued->seed);
}

}  // namespace zshard
