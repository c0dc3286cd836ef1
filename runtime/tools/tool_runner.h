// The skeleton every zshard tool's main() shares: start the world, parse the flags (the same on every
// rank: checked, as a launch may give ranks different ones), run the body, and turn failures into zshard's
// exits:
//   start-up failure       one line from every rank, exit 1 (comm::init_world failed)
//   other flags than rank 0's, a bad flag or value
//                          one line from the first rank refusing them, exit 2 on every rank
//   set-up failure         the agreed exit code on every rank (see agreed_failure.h)
//   failure mid-run        the failing rank's line, then the whole job is aborted (no rank left waiting)
#pragma once
#include <functional>

#include <CLI/CLI.hpp>

#include <zshard/communicator.h>

namespace zshard {

int run_tool(const char* name, int argc, char** argv, CLI::App& app,
             const std::function<void(comm::Communicator& world)>& body);

// The same exits for a single-process tool (no MPI): parse, run the body, return its exit code; a bad
// flag or a UsageError prints one line and returns 2, an AgreedFailure (of an engine on a world of one)
// "NAME: error: ..." and its code, any other failure "NAME: error: ..." and 1.
int run_local_tool(const char* name, int argc, char** argv, CLI::App& app, const std::function<int()>& body);

}  // namespace zshard
