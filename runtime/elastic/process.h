// Child processes of zshard-run: the mpirun of each attempt, with its output read through pipes, and the
// probes that ask whether a host still answers.
#pragma once
#include <string>
#include <vector>

#include <sys/types.h>

namespace zshard::elastic {

// A child in a process group of its own (so that a terminal's Ctrl-C reaches the launcher alone, which
// then decides what the job gets), its stdout and stderr on pipes unless `inherit_output`.
struct Child {
  pid_t pid = -1;
  int out = -1, err = -1;  // the read ends; -1 when inherited or closed
};
Child spawn(const std::vector<std::string>& argv, bool inherit_output);

// Whether `program` would start: a path naming an executable file, or a bare name found on $PATH.
bool is_executable(const std::string& program);

// The exit status as a shell shows it: the code, or 128 + the signal that ended the process.
int exit_status(int wait_status);

// Runs `probe` (a shell command; the host is its $1) for every host at once; true where it exits 0 within
// `timeout_s` seconds. A probe still running then is killed, process group and all.
std::vector<bool> probe_hosts(const std::vector<std::string>& hosts, const std::string& probe, double timeout_s);

// This machine's host name, and whether `host` names this machine (it answers without a probe).
std::string local_host_name();
bool is_local_host(const std::string& host);

}  // namespace zshard::elastic
