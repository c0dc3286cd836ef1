// CUDA runtime glue: error-check macros, device selection, and the hooks that make the tracking allocator
// and the byte copies of kernels/ work on device memory.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string_view>

#include "kernels/allocator.h"

namespace zshard {
class CopyStream;
}

namespace zshard::cuda {

// Each throws zshard::Error "file:line: call failed: <library message> (code N)".
[[noreturn]] void cuda_fail(cudaError_t code, std::string_view call, const char* file, int line);
[[noreturn]] void cublas_fail(cublasStatus_t code, std::string_view call, const char* file, int line);
// The code is an ncclResult_t; taken as int so that this header does not need nccl.h.
[[noreturn]] void nccl_fail(int code, std::string_view call, const char* file, int line);

// True when at least one GPU is usable. Without a driver or a device it returns false, never throws.
bool cuda_available();

// Selects `device` for this thread and installs the raw allocator (stream-ordered cudaMallocAsync/
// cudaFreeAsync on the compute stream) and the device memset/copy ops, so that Buffer(…, Device::cuda, …)
// and copy_bytes work. Call once per process before any device allocation. Host buffers of Category::host
// become page-locked (cudaHostAlloc), for the offloaded optimizer's asynchronous copies.
void cuda_init(int device);

// The stream this thread's ops, allocations, memsets and device copies go to when no other is named: the
// legacy default stream (null) unless set. A CUDA graph cannot capture the legacy stream, so an engine that
// replays its steps as graphs (shard/step_graph.h) sets a stream of its own, a blocking one, which still
// waits for anything left on the legacy stream outside a capture.
cudaStream_t compute_stream();
void set_compute_stream(cudaStream_t stream);

// Blocks the host until the work queued on `stream` so far is done, by polling an event rather than in the
// driver, and runs the wait hook between polls. Every host wait on device work goes through here or
// wait_event.
void synchronize_stream(cudaStream_t stream);
// The same for the work before `event`'s latest record (on any stream).
void wait_event(cudaEvent_t event);
// What a host blocked in synchronize_stream does between polls. The NCCL backend installs its
// watchdogs here: compute may be waiting on a collective that never completes, and a wait in the driver
// would hang the job instead of letting the watchdog abort it.
void set_wait_hook(std::function<void()> hook);

// True once `stream` has finished its queued work, false if it has not within `patience` (or fails).
// For teardown, where a stuck kernel must not hang the process: never throws, never waits in the driver.
bool became_idle(cudaStream_t stream, std::chrono::milliseconds patience) noexcept;

// Returns the pool's unused memory to the driver, once the compute stream is idle (otherwise nothing:
// frees still queued there are not final). Never throws.
void release_pool_memory() noexcept;

// The cuBLAS handle of the current thread (created on first use, lives until the thread ends).
cublasHandle_t cublas_handle();
// The scratch a cuBLAS call is given: the size of cuBLAS's own default pool on the current device (32 MiB
// on Hopper and later, 4 MiB before), so that it picks the kernels it would pick by default.
size_t cublas_workspace_bytes();

// Scratch memory for an op on `stream`, from the tracking allocator (Category::workspace). The allocator
// frees in order on the compute stream, which is `stream` or, for the legacy default stream, waits for the
// work of every blocking stream, so the memory cannot be reused while the op's kernels still run; a
// non-blocking stream other than the compute stream would break that and is refused.
Buffer workspace(size_t bytes, cudaStream_t stream);

// CopyStream::make for a GPU (kernels/copy_stream.h).
std::unique_ptr<CopyStream> make_copy_stream(int marks);

}  // namespace zshard::cuda

#define ZS_CUDA_CHECK(call)                                                      \
  do {                                                                           \
    if (cudaError_t zs_cuda_rc_ = (call); zs_cuda_rc_ != cudaSuccess)            \
      ::zshard::cuda::cuda_fail(zs_cuda_rc_, #call, __FILE__, __LINE__);         \
  } while (0)

#define ZS_CUBLAS_CHECK(call)                                                    \
  do {                                                                           \
    if (cublasStatus_t zs_cublas_rc_ = (call); zs_cublas_rc_ != CUBLAS_STATUS_SUCCESS) \
      ::zshard::cuda::cublas_fail(zs_cublas_rc_, #call, __FILE__, __LINE__);     \
  } while (0)

#define ZS_NCCL_CHECK(call)                                                      \
  do {                                                                           \
    if (int zs_nccl_rc_ = int(call); zs_nccl_rc_ != 0 /* ncclSuccess */)         \
      ::zshard::cuda::nccl_fail(zs_nccl_rc_, #call, __FILE__, __LINE__);        \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, at the launching line.
#define ZS_CUDA_CHECK_LAUNCH() ZS_CUDA_CHECK(cudaGetLastError())
