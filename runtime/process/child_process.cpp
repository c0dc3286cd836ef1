#include "runtime/process/child_process.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include <zshard/error.h>

extern char** environ;

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

// Waits up to `seconds` for the child to exit; true if it did (and is reaped into `status`).
bool wait_for(pid_t pid, double seconds, int& status) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    if (waitpid(pid, &status, WNOHANG) == pid) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void check(int rc, const char* what) {
  if (rc != 0) fail(what, ": ", std::strerror(rc));
}

// posix_spawn's attributes and file actions, destroyed however spawn leaves.
struct SpawnSetup {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  SpawnSetup() {
    check(posix_spawn_file_actions_init(&actions), "posix_spawn_file_actions_init");
    check(posix_spawnattr_init(&attr), "posix_spawnattr_init");
  }
  ~SpawnSetup() {
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
  }
};

}  // namespace

Child spawn(const std::vector<std::string>& argv, const ChildOutput& output) {
  SpawnSetup setup;
  int out[2] = {-1, -1}, err[2] = {-1, -1}, log = -1;
  if (output.kind == ChildOutput::Kind::pipes) {
    if (pipe2(out, O_CLOEXEC) != 0) check(errno, "pipe");
    if (pipe2(err, O_CLOEXEC) != 0) {
      const int error = errno;
      close(out[0]);
      close(out[1]);
      check(error, "pipe");
    }
    posix_spawn_file_actions_adddup2(&setup.actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&setup.actions, err[1], STDERR_FILENO);
  } else if (output.kind == ChildOutput::Kind::file) {
    // Opened here, so that a log that cannot be written is reported as such, not as a program that
    // cannot run.
    log = open(output.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log < 0) fail(output.path, ": cannot write the log (", std::strerror(errno), ")");
    posix_spawn_file_actions_adddup2(&setup.actions, log, STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&setup.actions, log, STDERR_FILENO);
  }
  sigset_t defaults, none;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  sigaddset(&defaults, SIGPIPE);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&setup.attr, &defaults);
  posix_spawnattr_setsigmask(&setup.attr, &none);
  posix_spawnattr_setflags(&setup.attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  Child child;
  const int rc = posix_spawnp(&child.pid, args[0], &setup.actions, &setup.attr, args.data(), environ);
  for (int fd : {out[1], err[1], log})
    if (fd >= 0) close(fd);
  child.out = out[0];
  child.err = err[0];
  if (rc != 0) {
    for (int fd : {child.out, child.err})
      if (fd >= 0) close(fd);
    fail("cannot run ", argv[0], ": ", std::strerror(rc));
  }
  return child;
}

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

void signal_session(const Child& child, int signal) {
  for (int pid : session_processes(child.pid)) kill(pid, signal);
}

void end_session(const Child& child, int& status, bool& reaped) {
  if (!reaped) {
    kill(child.pid, SIGTERM);
    reaped = wait_for(child.pid, 5.0, status);
  }
  for (int round = 0; round < 50 && !session_processes(child.pid).empty(); ++round) {
    if (round > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    signal_session(child, SIGKILL);
    if (!reaped) reaped = waitpid(child.pid, &status, WNOHANG) == child.pid;
  }
  if (!reaped) reaped = waitpid(child.pid, &status, 0) == child.pid;
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
  const auto t0 = std::chrono::steady_clock::now();
  ChildResult r;
  // A log that cannot be written is the tool's failure, not the run's.
  if (!std::ofstream(log_path)) fail(log_path, ": cannot write the log (", std::strerror(errno), ")");
  Child child;
  try {
    child = spawn(argv, ChildOutput::file(log_path));
  } catch (const Error& e) {
    // As a shell reports a command it cannot run: in the run's log, exit code 127.
    std::ofstream(log_path) << e.what() << "\n";
    r.exit_code = 127;
    return r;
  }
  int status = 0;
  bool reaped = false;
  const auto deadline = t0 + std::chrono::duration<double>(timeout_s);
  while (!reaped) {
    reaped = waitpid(child.pid, &status, WNOHANG) == child.pid;
    if (reaped) break;
    r.interrupted = stop_requested();
    r.timed_out = !r.interrupted && std::chrono::steady_clock::now() >= deadline;
    if (r.interrupted || r.timed_out) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  end_session(child, status, reaped);
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!r.timed_out && !r.interrupted) {
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    else if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  }
  return r;
}

bool is_executable(const std::string& program) {
  const auto runs = [](const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
  };
  if (program.find('/') != std::string::npos) return runs(program);
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');)
    if (runs((dir.empty() ? std::string(".") : dir) + "/" + program)) return true;
  return false;
}

int exit_status(int wait_status) {
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 1;
}

}  // namespace zshard
