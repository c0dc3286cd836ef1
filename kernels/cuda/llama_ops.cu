// The ops Llama adds besides RMSNorm (rmsnorm.cu): rotary position embedding, grouped-query attention's
// packing of q, k, v for attention_forward, and SwiGLU.
#include "kernels/cuda/common.cuh"
#include "kernels/rope_frequencies.h"

namespace zshard::cuda {

namespace {

// Heads (over every batch element) one rope thread turns with the cos/sin of its (t, i): enough to hide the
// angle's fp64 arithmetic behind the memory traffic, few enough that small batches still fill the grid.
constexpr int kRopeHeadsPerThread = 32;

// One thread per (position t, pair i) of a grid row, over the heads of blockIdx.y's slice of (b, h).
// The angle t * f(i) (kernels/rope_frequencies.h) is computed in fp64 from the exact integer t, as the CPU op does, and its
// cos and sin rounded to fp32 once. An fp32 angle (exp2f of -2i/HS * log2(theta), times t) would carry a
// few ulp of relative error: 2e-4 rad and more at t = 4096, far beyond fp32 agreement with the CPU. The
// fp64 pow and sincos are paid once per (t, i) and shared by kRopeHeadsPerThread heads. direction is +1
// (forward) or -1 (backward: the transpose of a rotation is the rotation by minus the angle).
template <class T>
__global__ void rope_kernel(T* x, int Tn, int heads, int NH, int HS, ops::RopeFrequencies freq, float direction) {
  const int half = HS / 2;
  const size_t p = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (p >= size_t(Tn) * half) return;
  const int t = int(p / half), i = int(p % half);
  double sin_d, cos_d;
  sincos(t * rope::inv_freq(freq, i, HS), &sin_d, &cos_d);
  const float cs = float(cos_d), sn = direction * float(sin_d);
  const int bh_end = min(heads, int(blockIdx.y + 1) * kRopeHeadsPerThread);
  for (int bh = blockIdx.y * kRopeHeadsPerThread; bh < bh_end; ++bh) {
    const int b = bh / NH, h = bh % NH;
    T* v = x + ((size_t(b) * Tn + t) * NH + h) * HS;
    const float a = to_f32(v[i]), c = to_f32(v[i + half]);
    v[i] = from_f32<T>(a * cs - c * sn);
    v[i + half] = from_f32<T>(c * cs + a * sn);
  }
}

template <class T>
void rope(T* x, int B, int Tn, int NH, int HS, const ops::RopeFrequencies& freq, float direction, cudaStream_t stream) {
  ZS_CHECK(HS % 2 == 0, "rope: the head size must be even, got ", HS);
  const size_t pairs = size_t(Tn) * (HS / 2);
  const int heads = B * NH;
  if (pairs == 0 || heads == 0) return;
  const size_t blocks_x = (pairs + kBlockSize - 1) / kBlockSize;
  const int blocks_y = (heads + kRopeHeadsPerThread - 1) / kRopeHeadsPerThread;
  ZS_CHECK(blocks_x <= 0x7fffffffu && blocks_y <= 65535, "rope: (T, heads) = (", Tn, ", ", heads,
           ") exceeds the grid");
  const dim3 grid{unsigned(blocks_x), unsigned(blocks_y)};
  rope_kernel<<<grid, kBlockSize, 0, stream>>>(x, Tn, heads, NH, HS, freq, direction);
  ZS_CUDA_CHECK_LAUNCH();
}

// qkv row = [q | k heads repeated | v heads repeated]: query head h reads kv head h / group. A copy of T,
// bit for bit.
template <class T>
__global__ void gqa_pack_kernel(T* qkv, const T* q, const T* k, const T* v, size_t rows, int NH, int group,
                                int HS) {
  const int C = NH * HS, KC = NH / group * HS;
  const size_t n = rows * 3 * C;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t row = i / (3 * C);
    const int j = int(i % (3 * C));
    if (j < C) {
      qkv[i] = q[row * C + j];
      continue;
    }
    const int part = j / C, rem = j - part * C;
    const size_t src = row * KC + size_t(rem / HS / group) * HS + rem % HS;
    qkv[i] = part == 1 ? k[src] : v[src];
  }
}

// One thread per element of a row of [dq | dk | dv]: a dq element adds its one entry of dqkv; a dk or dv
// element sums the entries of its group's query heads in head order, in fp32, and adds that once. No two
// threads write the same element, so the result is deterministic without atomics.
template <class T>
__global__ void gqa_pack_backward_kernel(T* dq, T* dk, T* dv, const T* dqkv, size_t rows, int NH, int group,
                                         int HS) {
  const int C = NH * HS, KC = NH / group * HS, W = C + 2 * KC;
  const size_t n = rows * W;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t row = i / W;
    const int j = int(i % W);
    const T* in = dqkv + row * 3 * C;
    if (j < C) {
      T* d = dq + row * C + j;
      *d = from_f32<T>(to_f32(*d) + to_f32(in[j]));
      continue;
    }
    const bool is_v = j >= C + KC;
    const int kj = j - C - (is_v ? KC : 0);  // within the row of dk or dv
    const T* src = in + (is_v ? 2 * C : C) + size_t(kj / HS) * group * HS + kj % HS;
    float sum = 0;
    for (int g = 0; g < group; ++g) sum += to_f32(src[size_t(g) * HS]);
    T* d = (is_v ? dv : dk) + row * KC + kj;
    *d = from_f32<T>(to_f32(*d) + sum);
  }
}

template <class T>
__global__ void swiglu_forward_kernel(T* out, const T* gate, const T* up, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float g = to_f32(gate[i]);
    out[i] = from_f32<T>(g / (1.f + expf(-g)) * to_f32(up[i]));
  }
}

// `set`: the gradients' first contribution, added to 0 rather than to what they held (never read).
template <class T>
__global__ void swiglu_backward_kernel(T* dgate, T* dup, const T* dout, const T* gate, const T* up, size_t n,
                                       bool set) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float g = to_f32(gate[i]), d = to_f32(dout[i]);
    const float sig = 1.f / (1.f + expf(-g));
    dup[i] = from_f32<T>((set ? 0.f : to_f32(dup[i])) + d * g * sig);
    // d silu / dg = sig * (1 + g * (1 - sig))
    dgate[i] = from_f32<T>((set ? 0.f : to_f32(dgate[i])) + d * to_f32(up[i]) * sig * (1.f + g * (1.f - sig)));
  }
}

}  // namespace

template <class T>
void rope_forward(T* x, int B, int Tn, int NH, int HS, const ops::RopeFrequencies& freq, cudaStream_t stream) {
  rope(x, B, Tn, NH, HS, freq, 1.f, stream);
}

template <class T>
void rope_backward(T* dx, int B, int Tn, int NH, int HS, const ops::RopeFrequencies& freq, cudaStream_t stream) {
  rope(dx, B, Tn, NH, HS, freq, -1.f, stream);
}

template <class T>
void gqa_pack(T* qkv, const T* q, const T* k, const T* v, int B, int Tn, int NH, int NKV, int HS,
              cudaStream_t stream) {
  ZS_CHECK(NKV > 0 && NH % NKV == 0, "gqa_pack: ", NH, " query heads do not share ", NKV, " kv heads evenly");
  const size_t rows = size_t(B) * Tn, n = rows * 3 * NH * HS;
  if (n == 0) return;
  gqa_pack_kernel<<<grid_for(n), kBlockSize, 0, stream>>>(qkv, q, k, v, rows, NH, NH / NKV, HS);
  ZS_CUDA_CHECK_LAUNCH();
}

template <class T>
void gqa_pack_backward(T* dq, T* dk, T* dv, const T* dqkv, int B, int Tn, int NH, int NKV, int HS,
                       cudaStream_t stream) {
  ZS_CHECK(NKV > 0 && NH % NKV == 0, "gqa_pack_backward: ", NH, " query heads do not share ", NKV,
           " kv heads evenly");
  const size_t rows = size_t(B) * Tn, n = rows * (NH + 2 * NKV) * HS;
  if (n == 0) return;
  gqa_pack_backward_kernel<<<grid_for(n), kBlockSize, 0, stream>>>(dq, dk, dv, dqkv, rows, NH, NH / NKV, HS);
  ZS_CUDA_CHECK_LAUNCH();
}

template <class T>
void swiglu_forward(T* out, const T* gate, const T* up, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  swiglu_forward_kernel<<<grid_for(n), kBlockSize, 0, stream>>>(out, gate, up, n);
  ZS_CUDA_CHECK_LAUNCH();
}

template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, size_t n, ops::InputGrad mode,
                     cudaStream_t stream) {
  if (n == 0) return;
  swiglu_backward_kernel<<<grid_for(n), kBlockSize, 0, stream>>>(dgate, dup, dout, gate, up, n,
                                                                   mode == ops::InputGrad::set);
  ZS_CUDA_CHECK_LAUNCH();
}

#define ZS_INSTANTIATE(T)                                                                                  \
  template void rope_forward<T>(T*, int, int, int, int, const ops::RopeFrequencies&, cudaStream_t);       \
  template void rope_backward<T>(T*, int, int, int, int, const ops::RopeFrequencies&, cudaStream_t);      \
  template void gqa_pack<T>(T*, const T*, const T*, const T*, int, int, int, int, int, cudaStream_t);      \
  template void gqa_pack_backward<T>(T*, T*, T*, const T*, int, int, int, int, int, cudaStream_t);         \
  template void swiglu_forward<T>(T*, const T*, const T*, size_t, cudaStream_t);                           \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, size_t, ops::InputGrad, cudaStream_t);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

}  // namespace zshard::cuda
