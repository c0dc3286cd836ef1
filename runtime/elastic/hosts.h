// The hosts zshard-run may place ranks on, each with its slots (ranks it takes): from --hosts, from a
// hostfile, or from the Slurm allocation the launcher runs in.
#pragma once
#include <string>
#include <vector>

namespace zshard::elastic {

struct Host {
  std::string name;
  int slots = 1;
  bool operator==(const Host&) const = default;
};

// "a:4,b:2" (a host without ":N" takes 1 slot). Throws UsageError naming --hosts.
std::vector<Host> parse_host_list(const std::string& text);
// An Open MPI hostfile: one host a line, "name", "name slots=N" or "name:N"; '#' starts a comment.
// Throws UsageError naming the file and line.
std::vector<Host> read_hostfile(const std::string& path);
// The allocation of a Slurm job: SLURM_JOB_NODELIST ("node[01-03,07],gpu5") with SLURM_TASKS_PER_NODE
// ("2(x3),1"), as Slurm exports them to salloc and sbatch. Throws UsageError naming the variable.
std::vector<Host> slurm_hosts(const std::string& nodelist, const std::string& tasks_per_node);
// "node[01-03,07],gpu5" as its names in order: node01 node02 node03 node07 gpu5.
std::vector<std::string> expand_nodelist(const std::string& nodelist);

// Refuses an empty list, a host named twice and a host of 0 slots (UsageError naming `source`).
void check_hosts(const std::vector<Host>& hosts, const std::string& source);
int total_slots(const std::vector<Host>& hosts);
// Each host's slots, in order: the ranks per host the plans take (plan_on_hosts, plan_batch).
std::vector<int> host_slots(const std::vector<Host>& hosts);
// "a:4,b:2": the --hosts form, also what mpirun's --host takes.
std::string host_list_text(const std::vector<Host>& hosts);

// Runs `probe` (a shell command; the host is its $1) for every host at once; true where it exits 0 within
// `timeout_s` seconds. A probe still running then is killed, session and all.
std::vector<bool> probe_hosts(const std::vector<std::string>& hosts, const std::string& probe, double timeout_s);

// This machine's host name, and whether `host` names this machine (it answers without a probe).
std::string local_host_name();
bool is_local_host(const std::string& host);

}  // namespace zshard::elastic
