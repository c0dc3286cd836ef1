// Learning-rate schedule: linear warmup, then constant or cosine decay to min_lr.
#pragma once
#include <string>

namespace zshard {

struct LrSchedule {
  float lr = 1e-3f;
  float min_lr = 0.0f;
  int warmup = 0;
  int total_steps = 0;  // the step cosine decay reaches min_lr at: required with cosine (left at 0, refused)
  bool cosine = true;
  // Learning rate of optimizer step `step` (0-based). Refuses (UsageError) a negative step, a negative or
  // non-finite lr, min_lr outside [0, lr] under cosine, a negative warmup, and cosine without total_steps:
  // a schedule decaying over one step would train at min_lr from the step after warmup, silently.
  float at(int step) const;
};

}  // namespace zshard
