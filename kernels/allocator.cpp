#include "kernels/allocator.h"

#include <climits>
#include <cstdint>
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
    case Category::frozen: return "frozen";
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
  return live[int(Category::params)] + live[int(Category::frozen)] + live[int(Category::grads)] + live[int(Category::optimizer)] +
         live[int(Category::host)];
}

namespace {
// glibc maps each block over its threshold (at most 32 MiB by default) afresh and unmaps it when freed,
// and gives the heap's free top back to the kernel: a step that frees and allocates its large buffers
// again (unsharded gradients, activations, the checkpoint snapshot) then faults in every page of them
// again. For gpt2 at np 2 on the cpu that was 14% of the samples and 20-30% of the step time. The heap
// keeps freed memory for the next step instead, so a process holds about the peak the memory report
// measures, plus the heap's fragmentation. Blocks of 2 GiB and more are still mapped. A user's own
// malloc settings (GLIBC_TUNABLES, MALLOC_*_) are left alone, and so is a glibc that refuses the
// threshold: setting the trim alone would pin the mmap threshold at its 128 KiB default.
bool keep_freed_host_memory() {
#ifdef __GLIBC__
  for (const char* user : {"GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"})
    if (std::getenv(user)) return false;
  return mallopt(M_MMAP_THRESHOLD, INT_MAX) == 1 && mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1;
#else
  return false;
#endif
}

// 64-byte alignment keeps SIMD loads aligned and buffers off each other's cache lines. It is made by hand
// over malloc, not by aligned_alloc: glibc's memalign asks the heap for more than a freed block of the
// same size holds, so each step's buffers would land on fresh pages (and the heap would grow by them)
// instead of reusing the last step's. The byte below the returned block holds its offset from malloc's.
constexpr size_t kAlignment = 64;

void* cpu_allocate(size_t bytes) {
  auto* raw = static_cast<unsigned char*>(std::malloc(bytes + kAlignment));
  if (!raw) throw std::bad_alloc();
  unsigned char* block = raw + (kAlignment - reinterpret_cast<uintptr_t>(raw) % kAlignment);
  block[-1] = static_cast<unsigned char>(block - raw);
  return block;
}

void cpu_release(void* p) {
  auto* block = static_cast<unsigned char*>(p);
  std::free(block - block[-1]);
}
}  // namespace

Allocator::Allocator(Device device) : device_(device) {
  if (device != Device::cpu) return;
  keeps_freed_memory_ = keep_freed_host_memory();
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
