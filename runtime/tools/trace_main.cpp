// zshard-trace: lines up the flight-recorder dumps that a job's ranks wrote to --trace-dir and says in its
// first line what went wrong: the first collective at which the ranks disagree, or the rank that never
// entered the collective the others waited in. A table of what each rank was doing follows. One process,
// no MPI: run it anywhere the dumps were gathered.
#include <iostream>

#include "runtime/tools/tool_runner.h"
#include "comm/flight_recorder/analysis.h"

using namespace zshard;

int main(int argc, char** argv) {
  std::string dir;
  CLI::App app{"zshard-trace: what each rank's last collectives say about a failed or hung job"};
  app.add_option("dir", dir, "the --trace-dir the job's ranks dumped to (rank-NNNNN.trace files)")->required();
  return run_local_tool("zshard-trace", argc, argv, app, [&] {
    // A dump's name that holds no dump (a FIFO, a device, a directory) is refused, not skipped: it was put
    // there by hand, and leaving it out would blame its rank for leaving no dump.
    const TraceReport report = analyse_traces(read_trace_dir(dir));
    std::cout << report.verdict << "\n";
    for (const std::string& line : report.lines) std::cout << line << "\n";
    return 0;
  });
}
