// Ending the job: when one rank fails, every rank ends at once, so that none is left waiting in a
// collective. Below the communicators, which end the job from a destructor that cannot throw.
#pragma once

namespace zshard::comm {

// True between MPI_Init and MPI_Finalize.
bool mpi_active();

// Ends every rank of the job at once (MPI_Abort when MPI is up): used when one rank fails so that no
// other rank is left waiting in a collective. The flight recorder dumps this rank's collectives first
// (comm/flight_recorder/recorder.h), and from then on SIGTERM ends the process. Does not return.
[[noreturn]] void abort_world(int exit_code);

// For a SIGTERM or SIGINT handler that lets the process go on (the save policy's clean stop); async-
// signal-safe. Dumps the flight record, and notes that the launcher is ending the job: a rank that fails
// from now on exits at once instead of asking MPI to abort it again.
void note_termination_signal(int signal);

}  // namespace zshard::comm
