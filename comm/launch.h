// Process launch: a run under mpirun or srun gets an MPI world; a plain run is a world of one that needs
// no MPI at all. Users never call MPI themselves. Ending the job on a failure: comm/abort.h.
#pragma once
#include <memory>
#include <string_view>

#include <zshard/communicator.h>

namespace zshard::comm {

// True when a launcher (OpenMPI's mpirun, a PMI/PMIx launcher, or SLURM's srun) started this process.
bool launched_by_mpi();

// Initialises MPI when launched by mpirun/srun, and returns the world communicator (self otherwise).
std::unique_ptr<Communicator> init_world(int* argc, char*** argv);

// The world's ranks on this host (sharing its memory), this one included; 1 without MPI. Set by init_world.
int ranks_on_this_host();
// The lowest world rank on this host; 0 without MPI. Set by init_world.
int first_rank_on_this_host();
// Whether this host has more CPUs than ranks (the union of the ranks' affinity masks; without MPI, the
// hardware threads against one rank). Set by init_world.
bool cores_to_spare();

// Obeys the test hook ZSHARD_TEST_STALL_SET_UP (kernels/test_hooks.h) at `where`: "plan" where set-up is
// about to issue its first collective, "engine" before an engine splits its process groups.
void maybe_stall_in_set_up(int rank, std::string_view where);

// MPI_Finalize if MPI was initialised; safe to call always.
void finalize_world();

}  // namespace zshard::comm
