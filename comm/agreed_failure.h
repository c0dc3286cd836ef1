// Failures every rank agrees on. Before the first collective (and around each file a run writes): if any
// rank's part throws, every rank learns it through one all-reduce and throws AgreedFailure, so the whole
// job exits with the same code and one message instead of some ranks waiting forever in the next
// collective. A failure every rank sees alike anyway (a non-finite step) is thrown as AgreedFailure
// directly.
#pragma once
#include <functional>

#include <zshard/communicator.h>
#include <zshard/error.h>

namespace zshard {

// Runs `setup` on every rank; a UsageError becomes exit code 2, a DamagedCheckpoint 3, any other exception 1.
// An AgreedFailure from a run_agreed over the same world inside `setup` passes through as it is.
void run_agreed(comm::Communicator& world, const std::function<void()>& setup);

}  // namespace zshard
