#include "comm/launch.h"

#include <cstdio>
#include <cstdlib>

#include "comm/mpi_communicator.h"
#include "comm/self_communicator.h"
#include "kernels/error.h"

namespace zshard::comm {

namespace {
bool has_env(const char* name) { return std::getenv(name) != nullptr; }

bool mpi_active() {
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);  // both are callable before MPI_Init and after MPI_Finalize
  MPI_Finalized(&finalised);
  return initialised && !finalised;
}
}  // namespace

bool launched_by_mpi() {
  return has_env("OMPI_COMM_WORLD_SIZE") || has_env("PMI_SIZE") || has_env("PMIX_RANK") ||
         (has_env("SLURM_PROCID") && has_env("SLURM_NTASKS"));
}

std::unique_ptr<Communicator> init_world(int* argc, char*** argv) {
  if (!launched_by_mpi()) return std::make_unique<SelfCommunicator>();
  int initialised = 0;
  ZS_MPI_CHECK(MPI_Initialized(&initialised));
  if (!initialised) {
    // Only the main thread calls MPI.
    int provided = 0;
    ZS_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
    ZS_CHECK(provided >= MPI_THREAD_FUNNELED, "MPI provides thread level ", provided,
             ", zshard needs MPI_THREAD_FUNNELED");
  }
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
}

void abort_world(int exit_code) {
  // MPI_Abort and _Exit skip the stdio flush at exit: flush first so the failing rank's last line shows.
  std::fflush(stdout);
  std::fflush(stderr);
  if (mpi_active()) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

void finalize_world() {
  if (mpi_active()) ZS_MPI_CHECK(MPI_Finalize());
}

}  // namespace zshard::comm
