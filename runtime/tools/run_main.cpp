// zshard-run: the elastic launcher. Runs a training command under mpirun on hosts with slots; when the job
// fails (a rank or a host lost, a collective's deadline) it finds the hosts that still answer and
// relaunches on them from the newest committed checkpoint, with the same step (docs/recovery.md).
#include <cstdlib>
#include <iostream>
#include <sstream>

#include <zshard/error.h>

#include "runtime/elastic/supervisor.h"
#include "runtime/tools/tool_runner.h"

using namespace zshard;
using namespace zshard::elastic;

int main(int argc, char** argv) {
  LauncherOptions o;
  std::string hosts, hostfile, mpirun_args;
  if (const char* mpiexec = std::getenv("MPIEXEC"); mpiexec && *mpiexec) o.mpirun = mpiexec;
  CLI::App app{"zshard-run: run zshard-train under mpirun, and relaunch it on the hosts that still answer when "
               "the job fails.\nusage: zshard-run --hosts a:4,b:2 [options] -- zshard-train [flags]"};
  app.option_defaults()->always_capture_default();
  app.add_option("--hosts", hosts, "hosts and their slots (ranks each takes): NAME:SLOTS,NAME:SLOTS,...");
  app.add_option("--hostfile", hostfile, "an Open MPI hostfile: 'NAME slots=N' (or NAME:N) a line; a max_slots=N must hold the slots")
      ->excludes("--hosts");
  app.add_option("--min-ranks", o.min_ranks, "the fewest ranks the job may go on with");
  app.add_option("--max-restarts", o.max_restarts, "relaunches after a failure before giving up");
  app.add_option("--probe", o.probe,
                 "shell command that exits 0 when the host in $1 answers [default: Open MPI's rsh agent "
                 "(OMPI_MCA_plm_rsh_agent) or ssh in batch mode, running true there; srun inside Slurm]");
  app.add_option("--probe-timeout", o.probe_timeout_s, "seconds a host has to answer the probe");
  app.add_option("--mem-budget", o.mem_budget,
                 "memory each rank may use, e.g. 2GiB: on fewer ranks --grad-accum is raised until the "
                 "estimate fits [default: what the job's set-up memory check finds usable per rank of the fullest "
                 "host, seen from this host; where this host cannot tell (a GPU run), the first launch's estimate]");
  app.add_option("--mpirun", o.mpirun, "the mpirun to run (default: $MPIEXEC, else mpirun)");
  app.add_option("--mpirun-args", mpirun_args, "more arguments for mpirun, space separated (e.g. '--bind-to none')");
  app.add_option("command", o.command, "the training command, after --")->required();
  return run_local_tool("zshard-run", argc, argv, app, [&] {
    if (!hostfile.empty()) o.hosts = read_hostfile(hostfile);
    else if (!hosts.empty()) o.hosts = parse_host_list(hosts);
    else if (const char* nodes = std::getenv("SLURM_JOB_NODELIST")) {
      const char* tasks = std::getenv("SLURM_TASKS_PER_NODE");
      o.hosts = slurm_hosts(nodes, tasks ? tasks : "");
    } else {
      throw UsageError("give --hosts NAME:SLOTS,... or --hostfile FILE (or run inside a Slurm allocation)");
    }
    std::istringstream words(mpirun_args);
    for (std::string w; words >> w;) o.mpirun_args.push_back(w);
    return run_elastic(o);
  });
}
