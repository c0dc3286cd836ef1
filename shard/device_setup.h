// Putting a run on its device: whether the device is usable, selecting this rank's GPU, and the
// communicator that carries the strategy's collectives. Above kernels/, the only code that knows whether
// this zshard was built with the CUDA path (comm/nccl is compiled only with it).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include <zshard/communicator.h>
#include <zshard/dtype.h>

namespace zshard {

// Why this process cannot compute on `device`, or empty when it can (the cpu always can).
std::string device_unavailable(Device device);

// Makes `device` current for this process: on cuda, selects this rank's GPU (its local rank modulo the
// visible GPUs) and installs the device allocator and page-locked memory for the host category, so it
// must run before any device or host-category allocation. Nothing to do on cpu; cuda fails with
// device_unavailable's reason in a build without the CUDA path.
void select_device(Device device, comm::Communicator& world);

// Whether `backend` over a world of `world_size` ranks opens an NCCL communicator: nccl with two ranks or
// more. A world of one issues no collective, so it does not depend on NCCL's bootstrap (nor pay for it).
bool opens_nccl(CommBackend backend, int world_size);

// The communicator the strategy's groups split from: null for mpi (`world` itself carries them); for nccl,
// a new NCCL communicator over the same ranks (bootstrapped through `world`, which it keeps no reference
// to), or for a world of one the self communicator with `world`'s timeout. Collective over `world`;
// select_device must have run.
std::unique_ptr<comm::Communicator> open_device_comm(CommBackend backend, comm::Communicator& world);

// Free bytes on this rank's device divided among the host's ranks that share it (ranks_on_host over the
// visible GPUs, rounded up); -1 on cpu. select_device must have run.
int64_t device_free_memory_per_rank(Device device, int ranks_on_host);

// Hands memory the device allocator keeps for reuse back to the driver, for the libraries that allocate
// outside it (cuBLAS workspaces, NCCL buffers), e.g. between two runs in one process. Never throws; does
// nothing on cpu, or when device work is still queued after a second (a stuck kernel).
void release_cached_memory(Device device) noexcept;

}  // namespace zshard
