#include "runtime/tools/child_process.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <sstream>
#include <thread>

#include <zshard/error.h>

namespace zshard {

namespace {

volatile std::sig_atomic_t g_stop = 0;

void on_stop(int) { g_stop = 1; }

// The session id of a live process (field 6 of /proc/PID/stat, after the parenthesised name); -1 if it
// is gone or a zombie (dead, waiting for its parent: nothing left to end).
int session_of(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return -1;
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(stat.substr(close + 2));
  std::string state;
  int ppid = 0, pgrp = 0, session = -1;
  fields >> state >> ppid >> pgrp >> session;
  return state == "Z" ? -1 : session;
}

void signal_session(int session, int sig) {
  for (int pid : session_processes(session)) kill(pid, sig);
}

// Waits up to `seconds` for the leader to exit; true if it did (and is reaped into `status`).
bool wait_for(pid_t pid, double seconds, int& status) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    if (waitpid(pid, &status, WNOHANG) == pid) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Ends every process of the session: SIGTERM to the leader (mpirun ends and reaps its ranks, which would
// otherwise be left to init as zombies), then SIGKILL for whatever is left.
void end_session(pid_t leader, int& status, bool& reaped) {
  if (!reaped) {
    kill(leader, SIGTERM);
    reaped = wait_for(leader, 5.0, status);
  }
  for (int round = 0; round < 50 && !session_processes(leader).empty(); ++round) {
    if (round > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    signal_session(leader, SIGKILL);
    if (!reaped) reaped = waitpid(leader, &status, WNOHANG) == leader;
  }
  if (!reaped) reaped = waitpid(leader, &status, 0) == leader;
}

}  // namespace

std::vector<int> session_processes(int session) {
  std::vector<int> pids;
  DIR* dir = opendir("/proc");
  if (!dir) return pids;
  while (const dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    if (session_of(int(pid)) == session) pids.push_back(int(pid));
  }
  closedir(dir);
  return pids;
}

void catch_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

bool stop_requested() { return g_stop != 0; }

ChildResult run_child(const std::vector<std::string>& argv, double timeout_s, const std::string& log_path) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid < 0) fail("cannot start ", argv[0], ": fork failed");
  if (pid == 0) {
    setsid();
    const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    execvp(args[0], args.data());
    const std::string msg = "cannot run " + argv[0] + "\n";
    (void)!write(STDERR_FILENO, msg.data(), msg.size());
    _exit(127);
  }
  ChildResult r;
  int status = 0;
  bool reaped = false;
  const auto deadline = t0 + std::chrono::duration<double>(timeout_s);
  while (!reaped) {
    reaped = waitpid(pid, &status, WNOHANG) == pid;
    if (reaped) break;
    r.interrupted = stop_requested();
    r.timed_out = !r.interrupted && std::chrono::steady_clock::now() >= deadline;
    if (r.interrupted || r.timed_out) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Also after a normal exit: a rank that outlived its mpirun must not be left running.
  end_session(pid, status, reaped);
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!r.timed_out && !r.interrupted) {
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    else if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  }
  return r;
}

}  // namespace zshard
