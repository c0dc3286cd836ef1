#include "comm/agreed_failure.h"

#include <algorithm>
#include <vector>

#include "comm/backend_base.h"

namespace zshard {

void run_agreed(comm::Communicator& world, const std::function<void()>& setup) {
  int code = 0;
  std::string message;
  try {
    setup();
  } catch (const AgreedFailure&) {
    throw;  // agreed inside `setup` (a nested call, over this world): every rank holds it already
  } catch (const UsageError& e) {
    code = 2;
    message = e.what();
  } catch (const DamagedCheckpoint& e) {
    code = 3;
    message = e.what();
  } catch (const std::exception& e) {  // zshard::Error, and what the standard library throws
    // A collective that timed out or failed leaves its peers where they are: no agreement can be reached
    // (it would wait out a second deadline), so the failure goes on to end the job.
    if (comm::collectives_failed()) throw;
    code = 1;
    message = e.what();
  }
  // Every rank's exit code, so that all agree on the first failing rank: it alone reports, and its code
  // is the job's.
  std::vector<double> codes(size_t(world.size()), 0.0);
  codes[size_t(world.rank())] = code;
  comm::all_reduce_sum(world, codes.data(), codes.size());
  const auto first = std::find_if(codes.begin(), codes.end(), [](double c) { return c != 0; });
  if (first == codes.end()) return;
  const int first_rank = int(first - codes.begin());
  if (code != 0) throw AgreedFailure(message, code, world.rank() == first_rank);
  throw AgreedFailure("another rank failed", int(*first), false);
}

}  // namespace zshard
