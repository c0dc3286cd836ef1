// Byte-level memory operations that work on host and device pointers alike. On CPU builds the device
// versions throw; kernels/cuda installs the real ones.
#pragma once
#include <cstddef>

#include <zshard/dtype.h>

namespace zshard {

void memset_device(Device device, void* ptr, int value, size_t bytes);
// Copies between any two devices (host<->device, device<->device, host<->host).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);

// Where `ptr` lives: cuda for device memory once the CUDA path is initialised, cpu otherwise. Lets a
// host-only library (MPI) be handed either kind of buffer.
Device pointer_device(const void* ptr);
// Whether `ptr` is host memory the device copies from asynchronously (cudaHostAlloc'd: Category::host
// buffers on the CUDA path). False on CPU builds.
bool page_locked(const void* ptr);

struct DeviceMemoryOps {
  void (*memset)(void* ptr, int value, size_t bytes) = nullptr;
  // kind: 0 host->device, 1 device->host, 2 device->device
  void (*copy)(void* dst, const void* src, size_t bytes, int kind) = nullptr;
  bool (*is_device_pointer)(const void* ptr) = nullptr;
  bool (*is_page_locked)(const void* ptr) = nullptr;
};
void set_device_memory_ops(DeviceMemoryOps ops);

}  // namespace zshard
