#include "runtime/device_setup.h"

#include "kernels/error.h"

#ifdef ZSHARD_WITH_CUDA
#include "comm/nccl/nccl_communicator.h"
#include "kernels/cuda/runtime.h"
#endif

namespace zshard {

#ifdef ZSHARD_WITH_CUDA

std::string device_unavailable(Device device) {
  if (device == Device::cpu || cuda::cuda_available()) return "";
  return "no CUDA device is visible to this process (check CUDA_VISIBLE_DEVICES and the driver)";
}

void select_device(Device device, comm::Communicator& world) {
  if (device == Device::cuda) cuda::cuda_init(comm::local_device(world));
}

std::unique_ptr<comm::Communicator> open_device_comm(CommBackend backend, comm::Communicator& world) {
  if (backend == CommBackend::mpi) return nullptr;
  int device = 0;
  ZS_CUDA_CHECK(cudaGetDevice(&device));  // the one select_device chose
  return std::make_unique<comm::NcclCommunicator>(world, device);
}

void release_cached_memory(Device device) noexcept {
  if (device == Device::cuda) cuda::release_pool_memory();
}

#else

std::string device_unavailable(Device device) {
  if (device == Device::cpu) return "";
  return "this zshard was built without the CUDA path (configure with -DZSHARD_CUDA=ON where nvcc and NCCL "
         "are installed)";
}

void select_device(Device device, comm::Communicator&) {
  ZS_CHECK(device == Device::cpu, device_unavailable(device));
}

std::unique_ptr<comm::Communicator> open_device_comm(CommBackend backend, comm::Communicator&) {
  ZS_CHECK(backend == CommBackend::mpi, "--comm nccl: ", device_unavailable(Device::cuda));
  return nullptr;
}

void release_cached_memory(Device) noexcept {}

#endif

}  // namespace zshard
