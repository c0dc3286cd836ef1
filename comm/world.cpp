#include <zshard/world.h>

#include <atomic>

#include <zshard/error.h>

#include "comm/abort.h"
#include "comm/launch.h"

namespace zshard {

namespace {

// MPI starts once per process and cannot start again once finalised: a second World, beside the first or
// after it, would fail inside MPI with words that name neither.
std::unique_ptr<comm::Communicator> the_only_world(int* argc, char*** argv) {
  static std::atomic<bool> made{false};
  if (made.exchange(true))
    fail("zshard::World is made once per process (MPI cannot start again after it ends): keep one World for the "
         "whole program");
  return comm::init_world(argc, argv);
}

}  // namespace

World::World(int* argc, char*** argv) : comm_(the_only_world(argc, argv)) {}

World::~World() {
  comm_.reset();
  comm::finalize_world();
}

void World::abort(int exit_code) { comm::abort_world(exit_code); }

}  // namespace zshard
