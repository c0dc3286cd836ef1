// Tracking allocator: every large buffer in zshard is allocated here under a category, so that the
// memory report reads what was really allocated instead of estimating it.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include <zshard/memory.h>

namespace zshard {

// Raw memory source of one device; the CUDA library installs its own at start-up.
struct RawAllocator {
  void* (*allocate)(size_t bytes) = nullptr;
  void (*release)(void* ptr) = nullptr;
};

class Allocator {
 public:
  static Allocator& of(Device device);

  void* allocate(size_t bytes, Category category);
  void release(void* ptr, size_t bytes, Category category);
  MemStats stats() const;
  void reset_peaks();  // peaks restart from the current live bytes
  // Whether freed host memory stays in the heap for the next allocation (the cpu allocator, unless the
  // user tuned glibc's malloc: see keep_freed_host_memory in allocator.cpp).
  bool keeps_freed_memory() const { return keeps_freed_memory_; }
  void set_raw(RawAllocator raw);
  // Category::host buffers come from `raw` instead, once set: page-locked memory, which the CUDA path
  // installs into the host's allocator so that the offloaded optimizer's copies to and from the device
  // are asynchronous (from pageable memory cudaMemcpyAsync stages through a driver buffer and returns only
  // when done). A buffer goes back to the source that made it, so the source may not change while
  // host-category bytes are live.
  void set_host_category_raw(RawAllocator raw);

 private:
  explicit Allocator(Device device);
  const RawAllocator& source(Category category) const;
  Device device_;
  RawAllocator raw_;
  RawAllocator host_raw_;
  bool keeps_freed_memory_ = false;
  mutable std::mutex mutex_;
  MemStats stats_;
};

// The allocator of a host container that holds a large buffer (whole units gathered for a file, say), so
// that the memory report counts it under `C` as it counts a Buffer.
template <class T, Category C>
struct TrackedHost {
  using value_type = T;
  template <class U>
  struct rebind {
    using other = TrackedHost<U, C>;
  };
  TrackedHost() = default;
  template <class U>
  TrackedHost(const TrackedHost<U, C>&) {}
  T* allocate(size_t n) { return static_cast<T*>(Allocator::of(Device::cpu).allocate(n * sizeof(T), C)); }
  void deallocate(T* p, size_t n) { Allocator::of(Device::cpu).release(p, n * sizeof(T), C); }
};
template <class T, class U, Category C>
bool operator==(const TrackedHost<T, C>&, const TrackedHost<U, C>&) {
  return true;  // stateless: any one frees what another allocated
}

// fp32 values on the host held whole for a file: a unit gathered from its shards or read from one, or a
// model's named weights. Category::comm, as the device's gathered units.
using TrackedFloats = std::vector<float, TrackedHost<float, Category::comm>>;

}  // namespace zshard
