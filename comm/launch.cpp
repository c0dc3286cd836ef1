#include "comm/launch.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#ifdef __linux__
#include <sched.h>
#endif

#include <zshard/error.h>

#include "comm/abort.h"
#include "comm/mpi_communicator.h"
#include "comm/polling_work.h"
#include "comm/self_communicator.h"
#include "kernels/test_hooks.h"

namespace zshard::comm {

namespace {
bool has_env(const char* name) { return std::getenv(name) != nullptr; }

int& host_ranks() {
  static int ranks = 1;
  return ranks;
}

int& host_first_rank() {
  static int rank = 0;
  return rank;
}

// The CPUs this host's ranks may run on together; without MPI, this process's.
int& host_cpus() {
  static int cpus = int(std::thread::hardware_concurrency());
  return cpus;
}

// True when this node's ranks outnumber the CPUs they may run on together (the union of their affinity
// masks: right for unbound ranks, ranks bound to a core each, and cpusets alike). Records the node's rank
// count for ranks_on_this_host. Collective on the world.
bool node_oversubscribed() {
  MPI_Comm node = MPI_COMM_NULL;
  ZS_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int ranks = 1;
  ZS_MPI_CHECK(MPI_Comm_size(node, &ranks));
  host_ranks() = ranks;
  int rank = 0;
  ZS_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  ZS_MPI_CHECK(MPI_Allreduce(&rank, &host_first_rank(), 1, MPI_INT, MPI_MIN, node));
  int cpus = int(std::thread::hardware_concurrency());
#ifdef __linux__
  cpu_set_t mine, all;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof mine, &mine) != 0) std::memset(&mine, 0xff, sizeof mine);
  ZS_MPI_CHECK(MPI_Allreduce(&mine, &all, int(sizeof mine), MPI_BYTE, MPI_BOR, node));
  cpus = CPU_COUNT(&all);
#endif
  if (cpus > 0) host_cpus() = cpus;
  ZS_MPI_CHECK(MPI_Comm_free(&node));
  return cpus > 0 && ranks > cpus;
}
}  // namespace

bool launched_by_mpi() {
  return has_env("OMPI_COMM_WORLD_SIZE") || has_env("PMI_SIZE") || has_env("PMIX_RANK") ||
         (has_env("SLURM_PROCID") && has_env("SLURM_NTASKS"));
}

std::unique_ptr<Communicator> init_world(int* argc, char*** argv) {
  // The test hooks are read first, so that a malformed one ends each rank here, before MPI starts.
  const std::optional<bool> forced_backoff = test_hooks().poll_backoff;
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
  // Waits back off to short sleeps where ranks outnumber cores (comm/polling_work.h; the measurements are
  // in benchmarks/RESULTS.md). ZSHARD_POLL_BACKOFF=0 or 1 decides instead.
  PollPolicy policy = poll_policy();
  policy.backoff = node_oversubscribed();  // collective: every rank calls it
  if (forced_backoff) policy.backoff = *forced_backoff;
  set_poll_policy(policy);
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
}

int ranks_on_this_host() { return host_ranks(); }

int first_rank_on_this_host() { return host_first_rank(); }

bool cores_to_spare() { return host_cpus() > host_ranks(); }

void maybe_stall_in_set_up(int rank, std::string_view where) {
  const std::optional<TestHooks::StallSetUp>& stall = test_hooks().stall_set_up;
  if (stall && stall->rank == rank && stall->where == where)
    std::this_thread::sleep_for(std::chrono::milliseconds(stall->ms));
}

void finalize_world() {
  if (mpi_active()) ZS_MPI_CHECK(MPI_Finalize());
}

}  // namespace zshard::comm
