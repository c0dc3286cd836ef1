// The engine's memory report (Engine::memory_report): what each rank's allocator measured, per category,
// all-gathered, beside what the ZeRO arithmetic (zero_arithmetic.h) predicts for the same plan, and the
// communication each step moved beside its prediction.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include <zshard/communicator.h>
#include <zshard/memory_report.h>

namespace zshard {

class ShardedParams;

// Collective over `world`, the world `params` runs on. `step_comm` holds every step's (bytes moved,
// exposed ms), for the per-step means; `grad_accum`, the micro-steps of a step, for the prediction.
MemoryReport measure_memory(ShardedParams& params, comm::Communicator& world, int grad_accum,
                            const std::vector<std::pair<int64_t, double>>& step_comm);

}  // namespace zshard
