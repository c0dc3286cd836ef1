#include "kernels/allocator.h"

#include <climits>
#include <cstdlib>
#include <new>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <zshard/error.h>

namespace zshard {

std::string_view category_name(Category c) {
  switch (c) {
    case Category::params: return "params";
    case Category::grads: return "grads";
    case Category::optimizer: return "optimizer";
    case Category::activations: return "activations";
    case Category::comm: return "comm";
    case Category::workspace: return "workspace";
    case Category::host: return "host";
  }
  return "?";
}

int64_t MemStats::model_states_live() const {
  return live[int(Category::params)] + live[int(Category::grads)] + live[int(Category::optimizer)] +
         live[int(Category::host)];
}

namespace {
// glibc maps each block over its threshold (at most 32 MiB by default) afresh and unmaps it when freed,
// and gives the heap's free top back to the kernel: a step that frees and allocates its large buffers
// again (unsharded gradients, activations, the checkpoint snapshot) then faults in every page of them
// again, a third of the step on the cpu for gpt2 at np 2. The heap keeps freed memory for the next step
// instead, so a zshard process holds the peak the memory report measures (plus the heap's fragmentation)
// rather than faulting it in again each step.
void keep_freed_host_memory() {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, INT_MAX);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
#endif
}

// 64-byte alignment keeps SIMD loads aligned and buffers off each other's cache lines.
void* cpu_allocate(size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) throw std::bad_alloc();
  return p;
}
void cpu_release(void* p) { std::free(p); }
}  // namespace

Allocator::Allocator(Device device) : device_(device) {
  if (device != Device::cpu) return;
  keep_freed_host_memory();
  raw_ = {cpu_allocate, cpu_release};
}

Allocator& Allocator::of(Device device) {
  static Allocator cpu(Device::cpu);
  static Allocator cuda(Device::cuda);
  return device == Device::cpu ? cpu : cuda;
}

void Allocator::set_raw(RawAllocator raw) {
  std::lock_guard lock(mutex_);
  raw_ = raw;
}

void Allocator::set_host_category_raw(RawAllocator raw) {
  std::lock_guard lock(mutex_);
  const bool same = raw.allocate == host_raw_.allocate && raw.release == host_raw_.release;
  ZS_CHECK(same || stats_.live[int(Category::host)] == 0, "the source of ", device_name(device_),
           " host-category memory changed while ", stats_.live[int(Category::host)], " bytes of it are live");
  host_raw_ = raw;
}

const RawAllocator& Allocator::source(Category category) const {
  return category == Category::host && host_raw_.allocate ? host_raw_ : raw_;
}

void* Allocator::allocate(size_t bytes, Category category) {
  if (bytes == 0) bytes = 1;
  const RawAllocator& raw = source(category);
  ZS_CHECK(raw.allocate, "no allocator for device ", device_name(device_),
           " (was zshard built with CUDA?)");
  void* p = nullptr;
  try {
    p = raw.allocate(bytes);
  } catch (const std::bad_alloc&) {
    std::lock_guard lock(mutex_);
    fail("out of memory on ", device_name(device_), ": allocating ", bytes, " bytes for ",
         category_name(category), " with ", stats_.live_total, " bytes live");
  }
  std::lock_guard lock(mutex_);
  const int c = int(category);
  stats_.live[c] += int64_t(bytes);
  stats_.live_total += int64_t(bytes);
  if (stats_.live[c] > stats_.peak[c]) stats_.peak[c] = stats_.live[c];
  if (stats_.live_total > stats_.peak_total) stats_.peak_total = stats_.live_total;
  const int64_t states = stats_.model_states_live();
  if (states > stats_.model_states_peak) stats_.model_states_peak = states;
  return p;
}

void Allocator::release(void* ptr, size_t bytes, Category category) {
  if (!ptr) return;
  if (bytes == 0) bytes = 1;
  source(category).release(ptr);
  std::lock_guard lock(mutex_);
  stats_.live[int(category)] -= int64_t(bytes);
  stats_.live_total -= int64_t(bytes);
}

MemStats Allocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void Allocator::reset_peaks() {
  std::lock_guard lock(mutex_);
  stats_.peak = stats_.live;
  stats_.peak_total = stats_.live_total;
  stats_.model_states_peak = stats_.model_states_live();
}

Buffer::Buffer(size_t bytes, Device device, Category category)
    : bytes_(bytes), device_(device), category_(category) {
  ptr_ = Allocator::of(device).allocate(bytes, category);
}

Buffer::~Buffer() { Allocator::of(device_).release(ptr_, bytes_, category_); }

}  // namespace zshard
