// zshard-run's loop: run the training command under mpirun on the hosts that answer; when the job fails,
// find which hosts still answer and relaunch on them from the newest committed checkpoint with the same
// step, until the job ends, the restart budget is spent or too few ranks are left.
#pragma once
#include <string>
#include <vector>

#include "runtime/elastic/hosts.h"

namespace zshard::elastic {

struct LauncherOptions {
  std::vector<Host> hosts;  // as the readers of hosts.h return them (checked)
  int min_ranks = 1;
  int max_restarts = 3;
  std::string mpirun = "mpirun";
  std::vector<std::string> mpirun_args;  // put before the training command
  std::string probe;                     // a shell command whose $1 is the host; empty: default_probe()
  double probe_timeout_s = 10;
  std::string mem_budget;  // per rank; empty: what the job's memory check would allow (--help)
  std::vector<std::string> command;  // zshard-train (or a program of one's own built on it) and its flags
};

// What the launcher says to mpirun and the hosts and reads back (mpirun_interface.cpp):

// How a host is asked whether it answers when --probe is not given: through the agent mpirun would start
// its daemon with (Open MPI's plm_rsh_agent from the environment, else ssh in batch mode), or inside a
// Slurm allocation with srun on that node.
std::string default_probe(double timeout_s);

// The cause of a failed attempt from the end of mpirun's stderr and its exit status: the line that names
// it (a collective's deadline, a rank's error, a rank killed, a daemon lost, Open MPI's own message), else the status.
std::string failure_cause(const std::vector<std::string>& stderr_tail, int status);
// Whether a line is Open MPI's launcher refusing its own command line ("/usr/bin/mpiexec: Error: unknown
// option ..."): every launch with it would fail alike.
bool launcher_refusal(const std::string& line);

// `command` with every --FLAG VALUE and --FLAG=VALUE taken out, then --FLAG VALUE appended (when `value`
// is not null).
void set_flag(std::vector<std::string>& command, const std::string& flag, const char* value);

// Runs the job (UsageError for options that cannot work); returns the exit code.
int run_elastic(const LauncherOptions& options);

}  // namespace zshard::elastic
