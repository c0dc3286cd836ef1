// AdamW on the fp32 master shard, the PyTorch formula of kernels/cpu/adamw.cpp. One pass reads the
// gradient (fp32 or bf16), updates param, m and v, and optionally writes the bf16 compute copy, so mixed
// precision costs no extra sweep over the shard. Every operation rounds on its own (the _rn intrinsics,
// which nvcc never fuses into multiply-adds), as the host loop does: the offloaded optimizer's host step
// and this kernel give the same bits.
#include <cmath>

#include "kernels/cuda/common.cuh"

namespace zshard::cuda {

namespace {

// Scalars computed once on the host in double, then rounded to float, as the CPU op does.
struct AdamWScalars {
  float decay, step_size, inv_sqrt_bc2, b1, b2, one_minus_b1, one_minus_b2, eps, grad_scale;
};

template <class G>
__global__ void adamw_kernel(float* param, const G* grad, float* m, float* v, size_t n, AdamWScalars s,
                             bf16* param_bf16) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float g = __fmul_rn(to_f32(grad[i]), s.grad_scale);
    const float mi = __fadd_rn(__fmul_rn(s.b1, m[i]), __fmul_rn(s.one_minus_b1, g));
    const float vi = __fadd_rn(__fmul_rn(s.b2, v[i]), __fmul_rn(__fmul_rn(s.one_minus_b2, g), g));
    m[i] = mi;
    v[i] = vi;
    const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), s.inv_sqrt_bc2), s.eps);
    const float p = __fsub_rn(__fmul_rn(param[i], s.decay), __fdiv_rn(__fmul_rn(s.step_size, mi), denom));
    param[i] = p;
    if (param_bf16) param_bf16[i] = __float2bfloat16(p);
  }
}

}  // namespace

template <class G>
void adamw_step(float* param, const G* grad, float* m, float* v, size_t n, const AdamWParams& hp,
                bf16* param_bf16, cudaStream_t stream) {
  ZS_CHECK(hp.step >= 1, "adamw: step is 1-based, got ", hp.step);
  if (n == 0) return;
  const double bc1 = 1.0 - std::pow(double(hp.beta1), hp.step);
  const double bc2 = 1.0 - std::pow(double(hp.beta2), hp.step);
  const AdamWScalars s{float(1.0 - double(hp.lr) * double(hp.weight_decay)),
                       float(double(hp.lr) / bc1),
                       float(1.0 / std::sqrt(bc2)),
                       hp.beta1,
                       hp.beta2,
                       float(1.0 - double(hp.beta1)),
                       float(1.0 - double(hp.beta2)),
                       hp.eps,
                       hp.grad_scale};
  adamw_kernel<<<grid_for(n), kBlockSize, 0, stream>>>(param, grad, m, v, n, s, param_bf16);
  ZS_CUDA_CHECK_LAUNCH();
}

template void adamw_step<float>(float*, const float*, float*, float*, size_t, const AdamWParams&, bf16*,
                                cudaStream_t);
template void adamw_step<bf16>(float*, const bf16*, float*, float*, size_t, const AdamWParams&, bf16*,
                               cudaStream_t);

}  // namespace zshard::cuda
