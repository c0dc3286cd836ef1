// The steps a checkpoint save shares between Engine::save (synchronous) and AsyncCheckpoint: the step
// directory made ready, what each rank reports of its rank file, and the manifest written last by rank 0.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <zshard/communicator.h>
#include <zshard/tensor.h>

#include "shard/checkpoint_format.h"

namespace zshard {

class Engine;
class ShardedParams;

// A unit's owned fp32 shards in the order of kShardKinds: master params, Adam m, Adam v.
std::array<Tensor, kStateKinds> owned_state(const ShardedParams& params, int unit);

// Rank 0 makes `dir` ready for a save whose first `writers` ranks write the rank files: it creates it, or
// uncommits what is there (an interrupted save of this step, a pruned checkpoint's files moved in to be
// recycled) and removes all but those rank files, which the writers write over. A committed checkpoint
// there is refused, and so is a directory named for another step than `step` (step-00000042). Agreed:
// every rank throws AgreedFailure when it cannot.
void prepare_step_dir(comm::Communicator& world, const std::string& dir, int writers, int step);

// What a rank tells the others of its rank file: checksum and size as int32 halves, and whether writing it
// failed. Ranks outside the first shard group send zeros.
constexpr int kFileReportFields = 5;
using FileReport = std::array<int32_t, kFileReportFields>;
FileReport file_report(const CheckpointFile& file, bool failed);
bool report_failed(const FileReport& report);

// Rank 0 writes the manifest of the engine's checkpoint of `step` in `dir` from every rank's report
// (world-rank order; the first shard group's are the files), committing it. Agreed. Returns the bytes of
// the rank files.
int64_t commit_step_dir(Engine& engine, comm::Communicator& world, const std::string& dir, int step,
                        const std::vector<FileReport>& reports, nlohmann::json run);

}  // namespace zshard
