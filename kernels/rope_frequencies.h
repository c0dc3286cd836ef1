// The rotary frequencies, one definition for the CPU op (kernels/cpu/rope.cpp) and the CUDA kernel
// (kernels/cuda/llama_ops.cu): the same double operations on both sides, so that both turn by the same
// angles. Hugging Face computes them in float32; the two differ by rounding only.
#pragma once
#include <cmath>

#include <zshard/ops.h>

#include "kernels/host_device.h"

namespace zshard::rope {

// Pair i of a head of HS elements: theta^(-2i/HS), rescaled by Llama 3's rule when scaling.factor > 0
// (Hugging Face's _compute_llama3_parameters): a wavelength 2 pi / f longer than original_ctx /
// low_freq_factor is stretched by the factor, one shorter than original_ctx / high_freq_factor is kept,
// and one between is interpolated, smoothly in original_ctx / wavelength.
ZS_HOST_DEVICE inline double inv_freq(const ops::RopeFrequencies& rope, int i, int HS) {
  const double f = ::pow(rope.theta, -2.0 * i / HS);
  const ops::RopeScaling& s = rope.scaling;
  if (!(s.factor > 0)) return f;
  const double wavelength = 2 * 3.14159265358979323846 / f;
  if (wavelength > s.original_ctx / s.low_freq_factor) return f / s.factor;
  if (wavelength < s.original_ctx / s.high_freq_factor) return f;
  const double smooth = (s.original_ctx / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1 - smooth) * f / s.factor + smooth * f;
}

}  // namespace zshard::rope
