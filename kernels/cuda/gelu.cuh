// GELU, tanh approximation (as kernels/cpu), and its derivative: the element-wise kernels' and the fused
// linear layer's where cuBLASLt has no epilogue kernel for a shape.
#pragma once

namespace zshard::cuda {

constexpr float kSqrt2OverPi = 0.79788456080286535588f;
constexpr float kGeluCubic = 0.044715f;

__device__ __forceinline__ float gelu(float x) {
  return 0.5f * x * (1.f + tanhf(kSqrt2OverPi * (x + kGeluCubic * x * x * x)));
}
__device__ __forceinline__ float gelu_grad(float x) {
  const float th = tanhf(kSqrt2OverPi * (x + kGeluCubic * x * x * x));
  const float sech2 = 1.f - th * th;
  return 0.5f * (1.f + th) + 0.5f * x * sech2 * kSqrt2OverPi * (1.f + 3.f * kGeluCubic * x * x);
}

}  // namespace zshard::cuda
