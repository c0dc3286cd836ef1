#include "runtime/setup_failure.h"

namespace zshard {

void run_agreed(comm::Communicator& world, const std::function<void()>& setup) {
  int code = 0;
  std::string message;
  try {
    setup();
  } catch (const UsageError& e) {
    code = 2;
    message = e.what();
  } catch (const Error& e) {
    code = 1;
    message = e.what();
  }
  // [rank 0's exit code, number of failing ranks]
  double agreed[2] = {world.rank() == 0 ? double(code) : 0.0, code ? 1.0 : 0.0};
  comm::all_reduce_sum(world, agreed, 2);
  if (agreed[1] == 0) return;
  if (code != 0) throw SetupFailure(message, code, world.rank() == 0 || agreed[0] == 0);
  throw SetupFailure("another rank failed during set-up", agreed[0] != 0 ? int(agreed[0]) : 1, false);
}

}  // namespace zshard
