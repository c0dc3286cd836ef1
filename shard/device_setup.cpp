#include "shard/device_setup.h"

#include <algorithm>

#include <zshard/error.h>

#include "comm/self_communicator.h"
#include "kernels/option_names.h"

#ifdef ZSHARD_WITH_CUDA
#include "comm/nccl/nccl_communicator.h"
#include "kernels/cuda/runtime.h"
#endif

namespace zshard {

namespace {
// The NCCL communicator over `world`'s ranks (two or more).
std::unique_ptr<comm::Communicator> open_nccl(comm::Communicator& world);
}  // namespace

bool opens_nccl(CommBackend backend, int world_size) { return backend == CommBackend::nccl && world_size > 1; }

std::unique_ptr<comm::Communicator> open_device_comm(CommBackend backend, comm::Communicator& world) {
  if (backend == CommBackend::mpi) return nullptr;
  if (opens_nccl(backend, world.size())) return open_nccl(world);
  auto self = std::make_unique<comm::SelfCommunicator>();
  self->set_timeout(world.timeout());
  return self;
}

#ifdef ZSHARD_WITH_CUDA

namespace {
std::unique_ptr<comm::Communicator> open_nccl(comm::Communicator& world) {
  int device = 0;
  ZS_CUDA_CHECK(cudaGetDevice(&device));  // the one select_device chose
  return std::make_unique<comm::NcclCommunicator>(world, device);
}
}  // namespace

std::string device_unavailable(Device device) {
  if (device == Device::cpu || cuda::cuda_available()) return "";
  return "no CUDA device is visible to this process (check CUDA_VISIBLE_DEVICES and the driver)";
}

void select_device(Device device, comm::Communicator& world) {
  if (device == Device::cuda) cuda::cuda_init(comm::local_device(world));
}

void release_cached_memory(Device device) noexcept {
  if (device == Device::cuda) cuda::release_pool_memory();
}

int64_t device_free_memory_per_rank(Device device, int ranks_on_host) {
  if (device != Device::cuda) return -1;
  size_t free = 0, total = 0;
  ZS_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  int devices = 1;
  ZS_CUDA_CHECK(cudaGetDeviceCount(&devices));
  const int sharing = (std::max(1, ranks_on_host) + devices - 1) / std::max(1, devices);
  return int64_t(free) / sharing;
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

namespace {
std::unique_ptr<comm::Communicator> open_nccl(comm::Communicator&) {
  fail(option_setting(Option::comm, "nccl", "CommBackend::nccl"), ": ", device_unavailable(Device::cuda));
}
}  // namespace

void release_cached_memory(Device) noexcept {}

int64_t device_free_memory_per_rank(Device, int) { return -1; }

#endif

}  // namespace zshard
