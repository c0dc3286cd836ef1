// What zshard-run says to mpirun and the hosts, and reads back: the probe that asks a host whether it
// answers, the training command's flags rewritten for a relaunch, and the cause of a failed attempt from
// the end of mpirun's stderr (declared in supervisor.h).
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <string>
#include <vector>

#include "runtime/elastic/supervisor.h"

namespace zshard::elastic {

std::string default_probe(double timeout_s) {
  const std::string seconds = std::to_string(std::max(1, int(timeout_s)));
  if (const char* agent = std::getenv("OMPI_MCA_plm_rsh_agent"); agent && *agent) {
    std::string first = agent;  // Open MPI's form is "ssh : rsh": the first that exists
    first = first.substr(0, first.find(':'));
    while (!first.empty() && first.back() == ' ') first.pop_back();
    return first + " \"$1\" true";
  }
  if (std::getenv("SLURM_JOB_ID")) return "srun --nodes=1 --ntasks=1 --overlap --nodelist=\"$1\" true";
  return "ssh -o BatchMode=yes -o ConnectTimeout=" + seconds + " \"$1\" true";
}

bool launcher_refusal(const std::string& line) {
  const size_t colon = line.find(": Error: ");
  if (colon == std::string::npos) return false;
  const std::string program = std::filesystem::path(line.substr(0, colon)).filename().string();
  return program == "mpirun" || program == "mpiexec" || program == "orterun" || program == "prterun";
}

std::string failure_cause(const std::vector<std::string>& tail, int status) {
  // In order of how directly a line names the cause: zshard's own (a deadline, a rank's error) first.
  const char* patterns[] = {"timed out", "zshard-train: rank", "error:", "exited on signal",
                            "lost communication", "unable to reliably start"};
  for (const char* p : patterns)
    for (const std::string& line : tail)
      if (line.find(p) != std::string::npos) {
        std::string cause = line;
        cause.erase(0, cause.find_first_not_of(" \t"));
        // Open MPI says this of a daemon it had started and then lost as well.
        return p == patterns[5] ? "mpirun lost a host's daemon (" + cause + ")" : cause;
      }
  // Open MPI's refusal of its own command line comes unframed.
  for (const std::string& line : tail)
    if (launcher_refusal(line)) return line;
  // Open MPI frames its other messages (a policy it does not know, a conflict in its settings) between
  // lines of dashes: the first paragraph of the first frame says what went wrong. The frames it adds
  // whenever a rank exits non-zero say nothing more than the status.
  const char* status_frames[] = {"Primary job", "mpirun detected that one or more processes exited with non-zero"};
  const auto rule = [](const std::string& line) { return line.rfind("-----", 0) == 0; };
  for (size_t open = 0; open < tail.size(); ++open) {
    if (!rule(tail[open])) continue;
    size_t close = open + 1;
    while (close < tail.size() && !rule(tail[close])) ++close;
    if (close == tail.size()) break;  // a frame cut off by the tail's start or end
    std::string paragraph;
    for (size_t k = open + 1; k < close && !tail[k].empty(); ++k) {
      std::string line = tail[k];
      line.erase(0, line.find_first_not_of(" \t"));
      paragraph += (paragraph.empty() ? "" : " ") + line;
    }
    const bool says_status = std::any_of(std::begin(status_frames), std::end(status_frames),
                                         [&](const char* s) { return paragraph.rfind(s, 0) == 0; });
    if (!paragraph.empty() && !says_status) return "mpirun: " + paragraph;
    open = close;  // the closing rule is no frame's opening
  }
  return "mpirun exited with status " + std::to_string(status);
}

void set_flag(std::vector<std::string>& command, const std::string& flag, const char* value) {
  std::vector<std::string> kept = {command.front()};
  for (size_t i = 1; i < command.size(); ++i) {
    if (command[i] == flag) {
      ++i;  // and its value
      continue;
    }
    if (command[i].rfind(flag + "=", 0) == 0) continue;
    kept.push_back(command[i]);
  }
  if (value) {
    kept.push_back(flag);
    kept.push_back(value);
  }
  command = std::move(kept);
}

}  // namespace zshard::elastic
