// What a checkpoint says of the frozen parameters it was trained on. It does not hold them: a LoRA
// checkpoint would otherwise carry the whole base model at every save, where the adapters and their Adam
// state are a few MB. It points to where they came from (the seed, or the weights file imported) and
// keeps their fingerprint, so that a load onto other frozen weights is refused rather than resumed onto
// a model that never trained with those adapters.
#pragma once
#include <string>

#include <zshard/communicator.h>

namespace zshard {

class ShardedParams;

// A hash of every frozen parameter's value, rounded to bf16 (so that an fp32 and a bf16 run of the same
// weights agree) and placed by unit and position: the same for any world size and strategy. "" when
// nothing is frozen. Collective over `world` (host memory).
std::string frozen_fingerprint(const ShardedParams& params, comm::Communicator& world);

}  // namespace zshard
