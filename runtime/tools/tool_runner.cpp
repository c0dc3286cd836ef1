#include "runtime/tools/tool_runner.h"

#include <iostream>

#include "comm/agreed_failure.h"
#include "comm/abort.h"
#include "comm/launch.h"
#include "kernels/option_names.h"
#include "runtime/cli/flags.h"

namespace zshard {

int run_tool(const char* name, int argc, char** argv, CLI::App& app,
             const std::function<void(comm::Communicator& world)>& body) {
  set_option_naming(OptionNaming::flags);
  std::unique_ptr<comm::Communicator> world;
  try {
    world = comm::init_world(&argc, &argv);
  } catch (const std::exception& e) {
    // Before any collective (a malformed test hook, a thread level MPI cannot give): each rank says so, in
    // one write so that the ranks' lines do not interleave, and ends; once MPI is up, with the whole job.
    std::cerr << std::string(name) + ": error: " + e.what() + "\n";
    if (comm::mpi_active()) comm::abort_world(1);
    return 1;
  }
  const int rank = world->rank();
  int code = 0;
  try {
    refuse_empty_values(app);
    app.parse(argc, argv);
    body(*world);
  } catch (const CLI::Error& e) {
    code = e.get_exit_code() == 0 ? 0 : 2;
    if (rank == 0) {
      if (code == 0) std::cout << app.help();
      else std::cerr << name << ": error: " << cli_error_line(e) << "\n";
    }
  } catch (const AgreedFailure& e) {
    if (e.report()) std::cerr << name << ": error: " << e.what() << "\n";
    code = e.exit_code();
  } catch (const std::exception& e) {
    // Mid-run failure on this rank: its peers may be inside a collective, so end the whole job now.
    std::cerr << name << ": rank " << rank << ": " << e.what() << "\n";
    comm::abort_world(1);
  }
  world.reset();
  comm::finalize_world();
  return code;
}

int run_local_tool(const char* name, int argc, char** argv, CLI::App& app, const std::function<int()>& body) {
  set_option_naming(OptionNaming::flags);
  try {
    refuse_empty_values(app);
    app.parse(argc, argv);
    return body();
  } catch (const CLI::Error& e) {
    if (e.get_exit_code() == 0) {
      std::cout << app.help();
      return 0;
    }
    std::cerr << name << ": error: " << cli_error_line(e) << "\n";
    return 2;
  } catch (const UsageError& e) {
    std::cerr << name << ": error: " << e.what() << "\n";
    return 2;
  } catch (const DamagedCheckpoint& e) {
    std::cerr << name << ": error: " << e.what() << "\n";
    return 3;
  } catch (const AgreedFailure& e) {  // a world of one's (an engine's): its code says whether the input was bad
    std::cerr << name << ": error: " << e.what() << "\n";
    return e.exit_code();
  } catch (const std::exception& e) {
    std::cerr << name << ": error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace zshard
