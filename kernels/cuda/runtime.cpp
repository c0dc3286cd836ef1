#include "kernels/cuda/runtime.h"

#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <new>
#include <thread>

#include <zshard/error.h>

#include "kernels/allocator.h"
#include "kernels/device_memory.h"

namespace zshard::cuda {

void cuda_fail(cudaError_t code, std::string_view call, const char* file, int line) {
  fail(file, ":", line, ": ", call, " failed: ", cudaGetErrorString(code), " (", cudaGetErrorName(code),
       ", code ", int(code), ")");
}

void cublas_fail(cublasStatus_t code, std::string_view call, const char* file, int line) {
  fail(file, ":", line, ": ", call, " failed: ", cublasGetStatusString(code), " (code ", int(code), ")");
}

void nccl_fail(int code, std::string_view call, const char* file, int line) {
  fail(file, ":", line, ": ", call, " failed: ", ncclGetErrorString(ncclResult_t(code)), " (code ", code,
       ")");
}

bool cuda_available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error so later queries start clean
    return false;
  }
  return count > 0;
}

namespace {

thread_local cudaStream_t current_compute_stream = nullptr;

// Stream-ordered allocation on the compute stream from the device's pool: cudaFree would synchronise the
// whole device on every transient buffer (gathered units, gradient and reduction buffers), which ends any
// overlap of communication with compute. Ordering is safe because every buffer a collective uses is
// released only after Work::wait() made the compute stream wait for it, or after test() saw it complete.
// Inside a graph capture the pair become the graph's own allocation and free nodes.
void* device_allocate(size_t bytes) {
  void* ptr = nullptr;
  ZS_CUDA_CHECK(cudaMallocAsync(&ptr, bytes, current_compute_stream));
  return ptr;
}

// Called from destructors: report, never throw.
void device_release(void* ptr) {
  if (cudaError_t rc = cudaFreeAsync(ptr, current_compute_stream); rc != cudaSuccess && rc != cudaErrorCudartUnloading)
    std::fprintf(stderr, "zshard: cudaFreeAsync failed: %s\n", cudaGetErrorString(rc));
}

// Page-locked host memory for Category::host (the offloaded optimizer's state and staging): a copy
// stream's cudaMemcpyAsync is asynchronous only to and from such memory. Out of memory is a bad_alloc,
// which the tracking allocator reports with the category and the bytes live.
void* pinned_allocate(size_t bytes) {
  void* ptr = nullptr;
  const cudaError_t rc = cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault);
  if (rc == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw std::bad_alloc();
  }
  if (rc != cudaSuccess) cuda_fail(rc, "cudaHostAlloc", __FILE__, __LINE__);
  return ptr;
}

// Called from destructors: report, never throw.
void pinned_release(void* ptr) {
  if (cudaError_t rc = cudaFreeHost(ptr); rc != cudaSuccess && rc != cudaErrorCudartUnloading)
    std::fprintf(stderr, "zshard: cudaFreeHost failed: %s\n", cudaGetErrorString(rc));
}

// The pool keeps what was freed instead of returning it to the driver at each synchronisation, so a
// step's transient buffers are reused by the next step without new driver allocations.
void keep_pool_memory(int device) {
  cudaMemPool_t pool = nullptr;
  ZS_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t keep_all = UINT64_MAX;
  ZS_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
}

}  // namespace

bool became_idle(cudaStream_t stream, std::chrono::milliseconds patience) noexcept {
  const auto give_up = std::chrono::steady_clock::now() + patience;
  cudaError_t rc;
  while ((rc = cudaStreamQuery(stream)) == cudaErrorNotReady && std::chrono::steady_clock::now() < give_up)
    std::this_thread::yield();
  return rc == cudaSuccess;
}

void release_pool_memory() noexcept {
  // The frees just queued finish at once on an idle stream; a busy one (a stuck kernel) is left alone.
  int device = 0;
  cudaMemPool_t pool = nullptr;
  if (!became_idle(current_compute_stream, std::chrono::seconds(1)) || cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetDefaultMemPool(&pool, device) != cudaSuccess)
    return;
  cudaMemPoolTrimTo(pool, 0);
}

namespace {

void device_memset(void* ptr, int value, size_t bytes) {
  ZS_CUDA_CHECK(cudaMemsetAsync(ptr, value, bytes, current_compute_stream));
}

// A copy that involves the host waits for the compute stream first (polling, see synchronize_stream), so
// the blocking cudaMemcpy itself can no longer wait on a stuck collective. One within the device is queued
// on the compute stream, as cudaMemcpy would queue it on the legacy one.
void device_copy(void* dst, const void* src, size_t bytes, int kind) {
  constexpr cudaMemcpyKind kKinds[] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                       cudaMemcpyDeviceToDevice};
  ZS_CHECK(kind >= 0 && kind < 3, "copy_bytes: bad copy kind ", kind);
  if (kKinds[kind] == cudaMemcpyDeviceToDevice) {
    ZS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kKinds[kind], current_compute_stream));
    return;
  }
  synchronize_stream(current_compute_stream);
  ZS_CUDA_CHECK(cudaMemcpy(dst, src, bytes, kKinds[kind]));
}

std::function<void()>& wait_hook() {
  static std::function<void()> hook;
  return hook;
}

// Called for every buffer handed to the mpi backend: a failed query means "not CUDA's", never an error.
cudaMemoryType memory_type(const void* ptr) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess) {
    cudaGetLastError();
    return cudaMemoryTypeUnregistered;
  }
  return attributes.type;
}
bool device_pointer(const void* ptr) { return memory_type(ptr) == cudaMemoryTypeDevice; }
bool page_locked_pointer(const void* ptr) { return memory_type(ptr) == cudaMemoryTypeHost; }

struct HandleHolder {
  cublasHandle_t handle = nullptr;
  ~HandleHolder() {
    if (handle) cublasDestroy(handle);
  }
};

}  // namespace

void cuda_init(int device) {
  ZS_CHECK(cuda_available(), "cuda_init: no CUDA device is available");
  int count = 0;
  ZS_CUDA_CHECK(cudaGetDeviceCount(&count));
  ZS_CHECK(device >= 0 && device < count, "cuda_init: device ", device, " out of range (", count,
           " visible)");
  ZS_CUDA_CHECK(cudaSetDevice(device));
  keep_pool_memory(device);
  Allocator::of(Device::cuda).set_raw({device_allocate, device_release});
  Allocator::of(Device::cpu).set_host_category_raw({pinned_allocate, pinned_release});
  set_device_memory_ops({device_memset, device_copy, device_pointer, page_locked_pointer});
}

void set_wait_hook(std::function<void()> hook) { wait_hook() = std::move(hook); }

cudaStream_t compute_stream() { return current_compute_stream; }
void set_compute_stream(cudaStream_t stream) { current_compute_stream = stream; }

void synchronize_stream(cudaStream_t stream) {
  struct Done {
    cudaEvent_t event = nullptr;
    ~Done() { cudaEventDestroy(event); }
  } done;
  ZS_CUDA_CHECK(cudaEventCreateWithFlags(&done.event, cudaEventDisableTiming));
  ZS_CUDA_CHECK(cudaEventRecord(done.event, stream));
  wait_event(done.event);
}

void wait_event(cudaEvent_t event) {
  for (;;) {
    const cudaError_t rc = cudaEventQuery(event);
    if (rc == cudaSuccess) return;
    if (rc != cudaErrorNotReady) cuda_fail(rc, "cudaEventQuery (wait_event)", __FILE__, __LINE__);
    if (wait_hook()) wait_hook()();
    std::this_thread::yield();
  }
}

Buffer workspace(size_t bytes, cudaStream_t stream) {
  unsigned flags = 0;
  if (stream && stream != current_compute_stream) ZS_CUDA_CHECK(cudaStreamGetFlags(stream, &flags));
  ZS_CHECK(!(flags & cudaStreamNonBlocking), "CUDA ops that take scratch memory run on blocking streams only");
  return Buffer(bytes, Device::cuda, Category::workspace);
}

cublasHandle_t cublas_handle() {
  thread_local HandleHolder holder;
  if (!holder.handle) ZS_CUBLAS_CHECK(cublasCreate(&holder.handle));
  return holder.handle;
}

size_t cublas_workspace_bytes() {
  thread_local size_t bytes = [] {
    int device = 0, major = 0;
    ZS_CUDA_CHECK(cudaGetDevice(&device));
    ZS_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    return size_t(major >= 9 ? 32 : 4) << 20;
  }();
  return bytes;
}

}  // namespace zshard::cuda
