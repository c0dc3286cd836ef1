#include "comm/abort.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <mpi.h>

#include "comm/flight_recorder/recorder.h"

namespace zshard::comm {

bool mpi_active() {
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);  // both are callable before MPI_Init and after MPI_Finalize
  MPI_Finalized(&finalised);
  return initialised && !finalised;
}

namespace {
volatile std::sig_atomic_t ending_by_signal = 0;
}  // namespace

void note_termination_signal(int signal) {
  dump_flight_record(trace::Reason::terminated, signal);
  ending_by_signal = 1;
}

void abort_world(int exit_code) {
  dump_flight_record(trace::Reason::abort);
  // MPI_Abort and _Exit skip the stdio flush at exit: flush first so the failing rank's last line shows.
  std::fflush(stdout);
  std::fflush(stderr);
  if (mpi_active()) {
    // The launcher ends a job after MPI_Abort with SIGCONT and SIGTERM, then waits a second before
    // SIGKILL (Open MPI's odls_base_sigkill_timeout, blocking its daemon). A failing rank dies at the
    // SIGTERM, where the stop handlers would keep it until the SIGKILL; a rank the launcher is already
    // ending (a stalled rank it has just woken) exits at once rather than asking for a second abort. On
    // namespace hosts this took a remote stall from about 3.6 s past the deadline to 1.5
    // (benchmarks/RESULTS.md).
    struct sigaction terminate{};
    terminate.sa_handler = SIG_DFL;
    sigemptyset(&terminate.sa_mask);
    sigaction(SIGTERM, &terminate, nullptr);
    if (ending_by_signal) std::_Exit(exit_code);
    // mpirun forwards a rank's output and handles its abort in one event loop, in no fixed order: its
    // MPI_ABORT banner could otherwise come before the line that names the cause.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    MPI_Abort(MPI_COMM_WORLD, exit_code);
  }
  std::_Exit(exit_code);
}

}  // namespace zshard::comm
