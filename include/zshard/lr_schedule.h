// Learning-rate schedule: linear warmup, then constant or cosine decay to min_lr.
#pragma once
#include <string>

namespace zshard {

struct LrSchedule {
  float lr = 1e-3f;
  float min_lr = 0.0f;
  int warmup = 0;
  int total_steps = 1;
  bool cosine = true;
  // Learning rate of optimizer step `step` (0-based; a negative step is refused, UsageError).
  float at(int step) const;
};

}  // namespace zshard
