#include <zshard/world.h>

#include "comm/abort.h"
#include "comm/launch.h"

namespace zshard {

World::World(int* argc, char*** argv) : comm_(comm::init_world(argc, argv)) {}

World::~World() {
  comm_.reset();
  comm::finalize_world();
}

void World::abort(int exit_code) { comm::abort_world(exit_code); }

}  // namespace zshard
