#include "comm/backend_base.h"

#include <atomic>

namespace zshard::comm {

namespace {
std::atomic<bool> failed{false};
}  // namespace

void mark_collectives_failed() { failed = true; }
bool collectives_failed() { return failed; }

}  // namespace zshard::comm
