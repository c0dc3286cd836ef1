// A command run in a session of its own, with a deadline, so that a tool can launch jobs (mpirun and its
// ranks) and end every process of one without leaving any behind. Open MPI puts each local rank in a
// process group of its own, so a process group would miss them; they stay in mpirun's session. Ending a
// run sends SIGTERM to its first process (mpirun then ends its ranks and exits), and SIGKILL after a
// grace period to whatever of the session is left; a run that ends by itself has its session swept too.
#pragma once
#include <string>
#include <vector>

namespace zshard {

struct ChildResult {
  int exit_code = -1;    // -1 when it did not exit by itself
  int signal = 0;        // the signal that ended it, if any (SIGKILL: often the kernel's OOM killer)
  bool timed_out = false;
  bool interrupted = false;  // the tool itself was asked to stop (SIGINT, SIGTERM)
  double wall_s = 0;
};

// Runs argv (argv[0] looked up in PATH), stdout and stderr into `log_path`, for at most `timeout_s`
// seconds, ending it early when the tool receives SIGINT or SIGTERM (see stop_requested).
ChildResult run_child(const std::vector<std::string>& argv, double timeout_s, const std::string& log_path);

// Catches SIGINT and SIGTERM from now on: run_child ends its session and returns, and stop_requested()
// says so, so that the tool can report and exit instead of dying with a job still running.
void catch_stop_signals();
bool stop_requested();

// The processes of a session, by scanning /proc (what run_child ends).
std::vector<int> session_processes(int session);

}  // namespace zshard
