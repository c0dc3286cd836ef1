// What zshard's own tools and tests reach past the public Engine: its sharded state (layouts, full unit
// copies, the optimizer's update guard) and the communicator its collectives run on. Neither is part of
// the public API; this header is not installed.
#pragma once
#include <zshard/engine.h>

#include "shard/engine_state.h"

namespace zshard {

struct EngineInternals {
  static ShardedParams& params(Engine& engine) { return *engine.state_->params_; }
  static const std::string& frozen_source(Engine& engine) { return engine.state_->frozen_source_; }
  static const std::string& frozen_fingerprint(Engine& engine) { return engine.frozen_fingerprint(); }  // collective
  // The world-sized communicator the engine's collectives run on: the NCCL one under --comm nccl, else
  // the world.
  static comm::Communicator& collective_world(Engine& engine) {
    return engine.state_->device_comm_ ? *engine.state_->device_comm_ : engine.world_;
  }
  // Steps replayed as CUDA graphs so far (EngineOptions::cuda_graphs; 0 without).
  static int64_t graph_replays(const Engine& engine) {
    return engine.state_->graph_ ? engine.state_->graph_->replays() : 0;
  }
};

}  // namespace zshard
