#include "runtime/elastic/hosts.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <zshard/error.h>

#include "runtime/cli/path_checks.h"
#include "runtime/process/child_process.h"

namespace zshard::elastic {

namespace {

// A slot count as written (digits only, at most 1e6); nothing when it is not one.
std::optional<int> slot_count(const std::string& text) {
  if (text.empty() || text.size() > 7 || text.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  const int n = std::stoi(text);
  if (n > 1000000) return std::nullopt;
  return n;
}

bool valid_name(const std::string& name) {
  return !name.empty() && name.find_first_of(" \t,:[]=#") == std::string::npos;
}

// "name" or "name:N" from `where`.
Host parse_host(const std::string& item, const std::string& where) {
  const size_t colon = item.find(':');
  Host h{item.substr(0, colon), 1};
  if (colon != std::string::npos) {
    const std::optional<int> n = slot_count(item.substr(colon + 1));
    if (!n) refuse(where, ": bad slot count in '", item, "' (want NAME:SLOTS, SLOTS a whole number)");
    h.slots = *n;
  }
  if (!valid_name(h.name)) refuse(where, ": bad host name in '", item, "'");
  return h;
}

}  // namespace

std::vector<Host> parse_host_list(const std::string& text) {
  std::vector<Host> hosts;
  std::string item;
  std::istringstream in(text + ",");  // the trailing comma closes the last item; an empty one is refused
  while (std::getline(in, item, ',')) {
    if (item.empty()) refuse("--hosts ", text, ": an empty item (want NAME:SLOTS,NAME:SLOTS,...)");
    hosts.push_back(parse_host(item, "--hosts " + text));
  }
  check_hosts(hosts, "--hosts " + text);
  return hosts;
}

std::vector<Host> read_hostfile(const std::string& path) {
  check_input_file("--hostfile", path, "a hostfile");  // a directory opens and reads as no hosts
  std::ifstream in(path);
  if (!in) refuse("--hostfile ", path, ": cannot read");
  std::vector<Host> hosts;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string name, word;
    if (!(words >> name)) continue;
    const std::string where = path + ":" + std::to_string(number);
    Host h = parse_host(name, where);
    std::optional<int> max_slots;
    while (words >> word) {
      const auto count = [&](const char* key) {
        const std::string prefix = std::string(key) + "=";
        return word.rfind(prefix, 0) == 0 ? slot_count(word.substr(prefix.size())) : std::nullopt;
      };
      // max_slots bounds what Open MPI may oversubscribe; zshard-run starts `slots` ranks, within it.
      std::optional<int> most = count("max_slots");
      if (!most) most = count("max-slots");
      if (most) {
        max_slots = most;
        continue;
      }
      const std::optional<int> n = count("slots");
      if (!n) refuse(where, ": '", word, "' is not slots=N or max_slots=N");
      h.slots = *n;
    }
    if (max_slots && h.slots > *max_slots) refuse(where, ": slots=", h.slots, " exceeds max_slots=", *max_slots);
    hosts.push_back(h);
  }
  check_hosts(hosts, "--hostfile " + path);
  return hosts;
}

std::vector<std::string> expand_nodelist(const std::string& nodelist) {
  std::vector<std::string> names;
  size_t i = 0;
  const size_t n = nodelist.size();
  while (i < n) {
    const size_t stop = nodelist.find_first_of(",[", i);
    const std::string prefix = nodelist.substr(i, stop - i);
    if (stop == std::string::npos || nodelist[stop] == ',') {
      if (prefix.empty()) refuse("SLURM_JOB_NODELIST ", nodelist, ": an empty name");
      names.push_back(prefix);
      i = stop == std::string::npos ? n : stop + 1;
      continue;
    }
    const size_t close = nodelist.find(']', stop);
    if (close == std::string::npos) refuse("SLURM_JOB_NODELIST ", nodelist, ": '[' without ']'");
    std::istringstream ranges(nodelist.substr(stop + 1, close - stop - 1));
    std::string range;
    while (std::getline(ranges, range, ',')) {
      const size_t dash = range.find('-');
      const std::string lo = range.substr(0, dash), hi = dash == std::string::npos ? lo : range.substr(dash + 1);
      const std::optional<int> a = slot_count(lo), b = slot_count(hi);
      if (!a || !b || *a > *b) refuse("SLURM_JOB_NODELIST ", nodelist, ": bad range '", range, "'");
      for (int k = *a; k <= *b; ++k) {
        std::string digits = std::to_string(k);
        if (digits.size() < lo.size()) digits.insert(0, lo.size() - digits.size(), '0');  // node[01-03]
        names.push_back(prefix + digits);
      }
    }
    i = close + 1;
    if (i < n && nodelist[i] != ',') refuse("SLURM_JOB_NODELIST ", nodelist, ": text after ']'");
    ++i;
  }
  return names;
}

std::vector<Host> slurm_hosts(const std::string& nodelist, const std::string& tasks_per_node) {
  const std::vector<std::string> names = expand_nodelist(nodelist);
  std::vector<int> slots;
  std::string item;
  std::istringstream in(tasks_per_node);
  while (std::getline(in, item, ',')) {  // "2(x3)": 2 tasks on each of 3 nodes
    const size_t paren = item.find("(x");
    const std::optional<int> count = slot_count(item.substr(0, paren));
    std::optional<int> times = 1;
    if (paren != std::string::npos) {
      times = item.back() == ')' ? slot_count(item.substr(paren + 2, item.size() - paren - 3)) : std::nullopt;
    }
    if (!count || !times) refuse("SLURM_TASKS_PER_NODE ", tasks_per_node, ": bad item '", item, "'");
    slots.insert(slots.end(), size_t(*times), *count);
  }
  if (slots.size() != names.size())
    refuse("SLURM_TASKS_PER_NODE ", tasks_per_node, " gives ", slots.size(), " node(s), SLURM_JOB_NODELIST ",
          nodelist, " ", names.size());
  std::vector<Host> hosts;
  for (size_t k = 0; k < names.size(); ++k) hosts.push_back({names[k], slots[k]});
  check_hosts(hosts, "the Slurm allocation");
  return hosts;
}

void check_hosts(const std::vector<Host>& hosts, const std::string& source) {
  if (hosts.empty()) refuse(source, ": no hosts");
  std::set<std::string> seen;
  for (const Host& h : hosts) {
    if (h.slots < 1) refuse(source, ": host ", h.name, " has 0 slots (every host takes 1 or more ranks)");
    if (!seen.insert(h.name).second) refuse(source, ": host ", h.name, " is named twice");
  }
}

int total_slots(const std::vector<Host>& hosts) {
  return std::accumulate(hosts.begin(), hosts.end(), 0, [](int sum, const Host& h) { return sum + h.slots; });
}

std::vector<int> host_slots(const std::vector<Host>& hosts) {
  std::vector<int> slots;
  for (const Host& h : hosts) slots.push_back(h.slots);
  return slots;
}

std::string host_list_text(const std::vector<Host>& hosts) {
  std::string text;
  for (const Host& h : hosts) text += (text.empty() ? "" : ",") + h.name + ":" + std::to_string(h.slots);
  return text;
}

namespace {

// Ends the probes still running, session and all (the probe's ssh too).
void end_probes(const std::vector<Child>& running) {
  for (const Child& probe : running) {
    if (probe.pid < 0) continue;
    signal_session(probe, SIGKILL);
    waitpid(probe.pid, nullptr, 0);
  }
}

}  // namespace

std::vector<bool> probe_hosts(const std::vector<std::string>& hosts, const std::string& probe, double timeout_s) {
  std::vector<bool> answers(hosts.size(), false);
  std::vector<Child> running(hosts.size());
  try {
    for (size_t i = 0; i < hosts.size(); ++i) {
      if (is_local_host(hosts[i])) {
        answers[i] = true;
        continue;
      }
      // Quiet: a host that does not answer is reported by the launcher in one line, not by ssh.
      running[i] = spawn({"sh", "-c", probe + " </dev/null >/dev/null 2>&1", "zshard-probe", hosts[i]},
                         ChildOutput::inherit());
    }
  } catch (...) {
    end_probes(running);  // the probes already started, when a later one cannot start
    throw;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    bool any = false;
    for (size_t i = 0; i < hosts.size(); ++i) {
      if (running[i].pid < 0) continue;
      int status = 0;
      if (waitpid(running[i].pid, &status, WNOHANG) == running[i].pid) {
        answers[i] = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        running[i].pid = -1;
      } else {
        any = true;
      }
    }
    if (!any) return answers;
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  end_probes(running);
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
