#include "runtime/elastic/process.h"

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <spawn.h>
#include <sstream>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include <zshard/error.h>

extern char** environ;

namespace zshard::elastic {

namespace {

void check(int rc, const char* what) {
  if (rc != 0) throw Error(detail::concat("zshard-run: ", what, ": ", std::strerror(rc)));
}

}  // namespace

Child spawn(const std::vector<std::string>& argv, bool inherit_output) {
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  posix_spawn_file_actions_t actions;
  check(posix_spawn_file_actions_init(&actions), "posix_spawn_file_actions_init");
  if (!inherit_output) {
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) check(errno, "pipe");
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
  }
  posix_spawnattr_t attr;
  check(posix_spawnattr_init(&attr), "posix_spawnattr_init");
  posix_spawnattr_setpgroup(&attr, 0);
  // The launcher's own handlers must not carry over, nor its blocked signals.
  sigset_t defaults, none;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  sigaddset(&defaults, SIGPIPE);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  Child child;
  const int rc = posix_spawnp(&child.pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (!inherit_output) {
    close(out[1]);
    close(err[1]);
    child.out = out[0];
    child.err = err[0];
  }
  if (rc != 0) {
    if (child.out >= 0) close(child.out);
    if (child.err >= 0) close(child.err);
    throw Error(detail::concat("cannot run ", argv[0], ": ", std::strerror(rc)));
  }
  return child;
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

std::vector<bool> probe_hosts(const std::vector<std::string>& hosts, const std::string& probe, double timeout_s) {
  std::vector<bool> answers(hosts.size(), false);
  std::vector<pid_t> running(hosts.size(), -1);
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (is_local_host(hosts[i])) {
      answers[i] = true;
      continue;
    }
    // Quiet: a host that does not answer is reported by the launcher in one line, not by ssh.
    Child c = spawn({"sh", "-c", probe + " </dev/null >/dev/null 2>&1", "zshard-probe", hosts[i]}, false);
    close(c.out);
    close(c.err);
    running[i] = c.pid;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    bool any = false;
    for (size_t i = 0; i < hosts.size(); ++i) {
      if (running[i] < 0) continue;
      int status = 0;
      if (waitpid(running[i], &status, WNOHANG) == running[i]) {
        answers[i] = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        running[i] = -1;
      } else {
        any = true;
      }
    }
    if (!any) return answers;
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (pid_t pid : running) {
    if (pid < 0) continue;
    kill(-pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  return answers;
}

std::string local_host_name() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

bool is_local_host(const std::string& host) {
  return host == "localhost" || host == "127.0.0.1" || host == local_host_name();
}

}  // namespace zshard::elastic
