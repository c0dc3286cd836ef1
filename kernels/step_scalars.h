// What the optimizer step keeps in device memory (ops::StepScalars) and the arithmetic the device does on
// it, one definition compiled for the CPU ops (kernels/engine_ops.cpp) and the CUDA kernels
// (kernels/cuda/reductions.cu), so that both clip alike. Additions and one division and square root in
// double, each rounded on its own on either side: nvcc contracts multiplies into FMAs, and there is none
// here; the host has no FMA at the baseline x86-64 target.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/host_device.h"

namespace zshard::cpu {

// One parameter's run of elements in a unit's owned shard, [begin, begin + count), and whether AdamW
// decays it. A unit's shard is cut into these once; its padding is in none of them.
struct ShardSegment {
  size_t begin = 0;
  size_t count = 0;
  bool weight_decay = false;
};

// AdamW's factors for one step, from AdamWParams in double and each rounded once to T (cpu::adamw_factors):
// decay[1] multiplies a decayed parameter, decay[0] (1) any other.
template <class T>
struct AdamWFactors {
  T decay[2];
  T step_size, inv_sqrt_bc2, b1, b2, one_minus_b1, one_minus_b2, eps;
};

// What the host sets for a step and the device reads where it is: copied in one piece each step
// (ops::set_step_settings), so that a step replayed as a CUDA graph reads the step's learning rate, bias
// corrections and clip bound, not its capture's.
struct StepSettings {
  AdamWFactors<float> adamw{};
  float max_norm = 0;  // clip_grad_norm's bound; 0: the norm alone, no clipping
};

// The step's scalars, on the device from the micro-steps to the step's end: the sums the step adds up there
// and what clip_grad_norm makes of them, read by AdamW where they are and by the host once, at the end.
struct StepScalars {
  double loss_sum = 0;      // the token losses of every rank's micro-steps
  double norm_squares = 0;  // the squared L2 norm of the whole gradient, padding left out
  double norm = 0;
  double grad_scale = 1;    // what AdamW multiplies the gradient by: torch's clip_grad_norm_ factor, or 1
  int64_t skip = 0;         // 1: the loss or the norm is not finite, and AdamW leaves every state as it is
  StepSettings settings{};
};

// first + values[0] + ... + values[n - 1], added in that order: every rank that adds the same values in
// the same order gets the same bits.
ZS_HOST_DEVICE inline double sum_in_order(const double* values, size_t n, double first) {
  double sum = first;
  for (size_t i = 0; i < n; ++i) sum += values[i];
  return sum;
}

// torch.nn.utils.clip_grad_norm_ with s.settings.max_norm: the gradient is scaled by max_norm / (norm +
// 1e-6) when that is below 1 (max_norm 0: never), the factor rounded to float as AdamW takes it. x - x is 0
// for a finite x and NaN for an infinite or NaN one: a finiteness test with no library call, the same on
// both sides.
ZS_HOST_DEVICE inline void clip_grad_norm(StepScalars& s) {
  const float max_norm = s.settings.max_norm;
  s.norm = sqrt(s.norm_squares);
  double scale = 1.0;
  if (max_norm > 0) {
    const double coef = double(max_norm) / (s.norm + 1e-6);
    if (coef < 1.0) scale = double(float(coef));
  }
  s.grad_scale = scale;
  s.skip = !(s.loss_sum - s.loss_sum == 0.0 && s.norm - s.norm == 0.0);
}

}  // namespace zshard::cpu
