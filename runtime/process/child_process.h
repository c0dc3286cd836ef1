// Starting and ending the processes a tool launches: zshard-run's mpirun of each attempt and its host
// probes, zshard-tune's candidate runs. Every child starts in a session of its own, and ending it ends
// the session: Open MPI puts each local rank in a process group of its own, so a process group would miss
// them, while they stay in mpirun's session. A session of its own also detaches the child from the
// terminal, so that a Ctrl-C reaches the tool alone, which then decides what the job gets.
#pragma once
#include <sys/types.h>

#include <string>
#include <vector>

namespace zshard {

// Where a child's stdout and stderr go: the tool's own, pipes the tool reads, or a file (truncated).
struct ChildOutput {
  enum class Kind { inherit, pipes, file };
  Kind kind = Kind::inherit;
  std::string path;  // for file
  static ChildOutput inherit() { return {}; }
  static ChildOutput pipes() { return {Kind::pipes, {}}; }
  static ChildOutput file(std::string path) { return {Kind::file, std::move(path)}; }
};

struct Child {
  pid_t pid = -1;  // also the child's session id
  int out = -1, err = -1;  // the read ends of ChildOutput::pipes(); -1 otherwise, or once closed
};

// Starts argv (argv[0] looked up in PATH) in a session of its own, with SIGINT, SIGTERM and SIGPIPE at
// their defaults and no signal blocked (the tool's own handlers and mask do not carry over). Throws Error
// naming argv[0] when it cannot start.
Child spawn(const std::vector<std::string>& argv, const ChildOutput& output);

// Sends `signal` to every process of `child`'s session still alive.
void signal_session(const Child& child, int signal);
// Ends every process of `child`'s session: SIGTERM to the child (mpirun then ends and reaps its ranks,
// which would otherwise be left to init as zombies) unless `reaped` says it has exited, a grace period,
// then SIGKILL for whatever is left. Reaps the child into `status` and sets `reaped`.
void end_session(const Child& child, int& status, bool& reaped);
// The processes of a session, by scanning /proc.
std::vector<int> session_processes(int session);

struct ChildResult {
  int exit_code = -1;    // -1 when it did not exit by itself
  int signal = 0;        // the signal that ended it, if any (SIGKILL: often the kernel's OOM killer)
  bool timed_out = false;
  bool interrupted = false;  // the tool itself was asked to stop (SIGINT, SIGTERM)
  double wall_s = 0;
};

// Runs argv, stdout and stderr into `log_path`, for at most `timeout_s` seconds, ending it early when the
// tool receives SIGINT or SIGTERM (see stop_requested). Its session is swept when it ends, also after a
// normal exit: a rank that outlived its mpirun must not be left running.
ChildResult run_child(const std::vector<std::string>& argv, double timeout_s, const std::string& log_path);

// Catches SIGINT and SIGTERM from now on: run_child ends its session and returns, and stop_requested()
// says so, so that the tool can report and exit instead of dying with a job still running.
void catch_stop_signals();
bool stop_requested();

// Whether `program` would start: a path naming an executable file, or a bare name found on $PATH.
bool is_executable(const std::string& program);

// The exit status as a shell shows it: the code, or 128 + the signal that ended the process.
int exit_status(int wait_status);

}  // namespace zshard
