#include "runtime/tools/tool_runner.h"

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <string>

#include "comm/agreed_failure.h"
#include "comm/abort.h"
#include "comm/launch.h"
#include "kernels/option_names.h"
#include "runtime/cli/flags.h"

namespace zshard {

namespace {

// Rank 0's arguments (after the program's path, which may differ by host), each ended by a NUL.
std::string arguments_text(int argc, char** argv) {
  std::string text;
  for (int i = 1; i < argc; ++i) (text += argv[i]) += '\0';
  return text;
}

// UsageError on a rank whose arguments are not rank 0's, naming the first that differs. Collective.
void check_same_arguments(comm::Communicator& world, int argc, char** argv) {
  const std::string mine = arguments_text(argc, argv);
  std::string first = mine;
  int32_t length = int32_t(first.size());
  world.broadcast(&length, 1, DType::i32, 0)->wait();
  first.resize(size_t(length) + size_t(length) % 2);  // whole u16 elements
  world.broadcast(first.data(), first.size() / 2, DType::u16, 0)->wait();
  first.resize(size_t(length));
  if (mine == first) return;
  size_t at = 0, index = 1;  // the first argument that differs, and its place
  for (size_t i = 0; i < std::min(mine.size(), first.size()) && mine[i] == first[i]; ++i)
    if (mine[i] == '\0') at = i + 1, ++index;
  const auto argument = [&](const std::string& text) {
    return at < text.size() ? "'" + text.substr(at, text.find('\0', at) - at) + "'" : std::string("none");
  };
  refuse("rank ", world.rank(), " is given other arguments than rank 0 (its argument ", index, " is ",
         argument(mine), ", rank 0's ", argument(first), "): every rank takes the same flags");
}

}  // namespace

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
    // Agreed, as a launch may give ranks different flags (mpirun -np 1 A : -np 1 B), or a flag's check
    // pass on one host and fail on another (a file only some hosts hold): every rank ends, none is left
    // in its first collective or running other steps than its peers.
    run_agreed(*world, [&] { check_same_arguments(*world, argc, argv); });
    bool help = false;
    run_agreed(*world, [&] {
      try {
        refuse_empty_values(app);
        app.parse(argc, argv);
      } catch (const CLI::Error& e) {
        if (e.get_exit_code() != 0) throw UsageError(cli_error_line(e, app));
        help = true;  // on every rank: their arguments are the same
      }
    });
    if (help) {
      if (rank == 0) std::cout << app.help();
    } else {
      body(*world);
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
    std::cerr << name << ": error: " << cli_error_line(e, app) << "\n";
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
