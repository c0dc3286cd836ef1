#include "kernels/device_memory.h"

#include <cstring>

#include <zshard/error.h>

namespace zshard {

namespace {
DeviceMemoryOps& device_ops() {
  static DeviceMemoryOps ops;
  return ops;
}
}  // namespace

void set_device_memory_ops(DeviceMemoryOps ops) { device_ops() = ops; }

void memset_device(Device device, void* ptr, int value, size_t bytes) {
  if (device == Device::cpu) {
    std::memset(ptr, value, bytes);
    return;
  }
  ZS_CHECK(device_ops().memset, "CUDA memory operation in a build without CUDA");
  device_ops().memset(ptr, value, bytes);
}

Device pointer_device(const void* ptr) {
  const auto query = device_ops().is_device_pointer;
  return query && query(ptr) ? Device::cuda : Device::cpu;
}

bool page_locked(const void* ptr) {
  const auto query = device_ops().is_page_locked;
  return query && query(ptr);
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device == Device::cpu && src_device == Device::cpu) {
    std::memcpy(dst, src, bytes);
    return;
  }
  ZS_CHECK(device_ops().copy, "CUDA memory operation in a build without CUDA");
  const int kind = src_device == Device::cpu ? 0 : dst_device == Device::cpu ? 1 : 2;
  device_ops().copy(dst, src, bytes, kind);
}

}  // namespace zshard
