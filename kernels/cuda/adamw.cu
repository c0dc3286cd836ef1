// AdamW on the fp32 master shard, the PyTorch formula of kernels/cpu/adamw.cpp. One launch covers a unit's
// whole owned shard: it reads the gradient (fp32 or bf16), updates param, m and v, and optionally writes
// the bf16 compute copy, so mixed precision costs no extra sweep over the shard. Every operation rounds on
// its own (the _rn intrinsics, which nvcc never fuses into multiply-adds), as the host loop does: the
// offloaded optimizer's host step and this kernel give the same bits.
#include <algorithm>

#include "kernels/cuda/common.cuh"

namespace zshard::cuda {

namespace {

// Up to kMaxSegments segments, passed by value in the kernel's parameters (no table to copy to the device
// first): block b steps chunk b - first_chunk[s] of segment s.
constexpr int kMaxSegments = 64;
constexpr size_t kChunk = size_t(kBlockSize) * 8;
struct Segments {
  size_t begin[kMaxSegments];
  size_t count[kMaxSegments];
  unsigned first_chunk[kMaxSegments + 1];
  uint64_t decayed;  // bit s: segment s decays
  int n;
};

// The factors come from device memory (StepScalars::settings, rewritten by the host each step), not the
// kernel's parameters: a CUDA graph replays the parameters its capture saw.
template <class G>
__global__ void adamw_kernel(float* param, const G* grad, float* m, float* v, Segments segs, const StepScalars* step,
                             bf16* param_bf16) {
  if (step->skip) return;  // a non-finite step: every state stays as it is
  const float grad_scale = float(step->grad_scale);
  const cpu::AdamWFactors<float> s = step->settings.adamw;
  int seg = 0;
  while (blockIdx.x >= segs.first_chunk[seg + 1]) ++seg;
  const float decay = s.decay[(segs.decayed >> seg) & 1u];
  const size_t offset = size_t(blockIdx.x - segs.first_chunk[seg]) * kChunk;
  const size_t begin = segs.begin[seg] + offset;
  const size_t end = begin + (segs.count[seg] - offset < kChunk ? segs.count[seg] - offset : kChunk);
  for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float g = __fmul_rn(to_f32(grad[i]), grad_scale);
    const float mi = __fadd_rn(__fmul_rn(s.b1, m[i]), __fmul_rn(s.one_minus_b1, g));
    const float vi = __fadd_rn(__fmul_rn(s.b2, v[i]), __fmul_rn(__fmul_rn(s.one_minus_b2, g), g));
    m[i] = mi;
    v[i] = vi;
    const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), s.inv_sqrt_bc2), s.eps);
    const float p = __fsub_rn(__fmul_rn(param[i], decay), __fdiv_rn(__fmul_rn(s.step_size, mi), denom));
    param[i] = p;
    if (param_bf16) param_bf16[i] = __float2bfloat16(p);
  }
}

}  // namespace

template <class G>
void adamw_step(float* param, const G* grad, float* m, float* v, std::span<const ShardSegment> segments,
                const StepScalars* step, bf16* param_bf16, cudaStream_t stream) {
  for (size_t first = 0; first < segments.size(); first += kMaxSegments) {
    Segments segs{};
    segs.n = int(std::min(segments.size() - first, size_t(kMaxSegments)));
    for (int k = 0; k < segs.n; ++k) {
      const ShardSegment& seg = segments[first + size_t(k)];
      segs.begin[k] = seg.begin;
      segs.count[k] = seg.count;
      segs.first_chunk[k + 1] = segs.first_chunk[k] + unsigned((seg.count + kChunk - 1) / kChunk);
      if (seg.weight_decay) segs.decayed |= uint64_t(1) << k;
    }
    for (int k = segs.n; k < kMaxSegments; ++k) segs.first_chunk[k + 1] = segs.first_chunk[segs.n];
    const unsigned blocks = segs.first_chunk[segs.n];
    if (blocks == 0) continue;
    adamw_kernel<<<blocks, kBlockSize, 0, stream>>>(param, grad, m, v, segs, step, param_bf16);
    ZS_CUDA_CHECK_LAUNCH();
  }
}

template void adamw_step<float>(float*, const float*, float*, float*, std::span<const ShardSegment>,
                                const StepScalars*, bf16*, cudaStream_t);
template void adamw_step<bf16>(float*, const bf16*, float*, float*, std::span<const ShardSegment>,
                               const StepScalars*, bf16*, cudaStream_t);

}  // namespace zshard::cuda
