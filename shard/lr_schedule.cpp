#include <zshard/lr_schedule.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include <zshard/error.h>

namespace zshard {

float LrSchedule::at(int step) const {
  if (step < 0) refuse("LrSchedule::at(", step, "): steps count from 0");
  if (!(std::isfinite(lr) && lr >= 0)) refuse("LrSchedule: lr must be a finite number >= 0, got ", lr);
  if (warmup < 0) refuse("LrSchedule: warmup must be >= 0, got ", warmup);
  if (cosine && total_steps < 1)
    refuse("LrSchedule: cosine decay needs total_steps >= 1 (the step it reaches min_lr), got ", total_steps);
  if (cosine && !(min_lr >= 0 && min_lr <= lr)) refuse("LrSchedule: min_lr must be in [0, lr ", lr, "], got ", min_lr);
  // Warmup reaches the full rate at its last step (llm.c and nanoGPT use the same (s+1)/warmup ramp).
  if (step < warmup) return lr * float(step + 1) / float(warmup);
  if (!cosine) return lr;
  const int decay_steps = std::max(total_steps - warmup, 1);
  const double progress = std::min(1.0, double(step - warmup) / decay_steps);
  return float(min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress)));
}

}  // namespace zshard
