// Token + position embedding, forward and backward; the position table is optional (Llama has none): a
// null wpe adds nothing, a null dwpe gets nothing. The backward is deterministic.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"

namespace zshard::cuda {

namespace {

template <class T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B,
                                         int Tn, int C) {
  const size_t n = size_t(B) * Tn * C;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t bt = i / C;
    const int c = int(i % C), t = int(bt % Tn);
    const T e = wte[size_t(tokens[bt]) * C + c];
    out[i] = wpe ? from_f32<T>(to_f32(e) + to_f32(wpe[size_t(t) * C + c])) : e;
  }
}

__global__ void iota_kernel(int32_t* out, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = i;
}

// A dwte row is the sum over every position holding its token. With the positions sorted by token (a
// stable radix sort), the block at a token's first sorted position owns that token's run: its warps take
// the run's rows in turn, lanes take columns, the warps' partial sums meet in shared memory in a fixed
// order, and the row is rounded into dwte once. Deterministic, and a frequent token (a space in byte
// data is a sixth of all positions) is walked by 32 warps, not serially. Atomics would vary the order
// and, in bf16, round a running sum at every one of that token's additions.
constexpr int kWteThreads = 1024;
constexpr int kWarpsPerBlock = kWteThreads / kWarpSize;

// __launch_bounds__: the compiler must keep registers within what 1024 threads per block can have.
template <class T>
__global__ void __launch_bounds__(kWteThreads) wte_backward_kernel(T* dwte, const T* dout, const int32_t* sorted_tokens,
                                    const int32_t* sorted_positions, int N, int C) {
  __shared__ float partial[kWarpsPerBlock][kWarpSize];
  __shared__ int run_end;
  const int first = blockIdx.x;
  const int32_t token = sorted_tokens[first];
  if (first > 0 && sorted_tokens[first - 1] == token) return;  // the whole block: not a run's start
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (warp == 0) {
    // The run ends at the first other token, 32 positions a probe; sorted, so a mismatch never reverts.
    int end = first + 1;
    for (;;) {
      const int j = end + lane;
      const unsigned same = __ballot_sync(0xffffffffu, j < N && sorted_tokens[j] == token);
      if (same != 0xffffffffu) {
        end += __ffs(~same) - 1;
        break;
      }
      end += kWarpSize;
    }
    if (lane == 0) run_end = end;
  }
  __syncthreads();
  const int end = run_end;
  for (int c0 = 0; c0 < C; c0 += kWarpSize) {
    const int c = c0 + lane;
    float sum = 0;
    if (c < C)
      for (int j = first + warp; j < end; j += kWarpsPerBlock)
        sum += to_f32(dout[size_t(sorted_positions[j]) * C + c]);
    partial[warp][lane] = sum;
    __syncthreads();
    if (warp == 0 && c < C) {
      for (int w = 1; w < kWarpsPerBlock; ++w) sum += partial[w][lane];
      T* row = dwte + size_t(token) * C;
      row[c] = from_f32<T>(to_f32(row[c]) + sum);
    }
    __syncthreads();
  }
}

// Positions do not collide: one thread per (t, c) sums over the batch, in a fixed order.
template <class T>
__global__ void wpe_backward_kernel(T* dwpe, const T* dout, int B, int Tn, int C) {
  const size_t n = size_t(Tn) * C;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float acc = to_f32(dwpe[i]);
    for (int b = 0; b < B; ++b) acc += to_f32(dout[size_t(b) * n + i]);
    dwpe[i] = from_f32<T>(acc);
  }
}

}  // namespace

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int Tn, int C,
                       cudaStream_t stream) {
  const size_t n = size_t(B) * Tn * C;
  if (n == 0) return;
  embedding_forward_kernel<<<grid_for(n), kBlockSize, 0, stream>>>(out, tokens, wte, wpe, B, Tn, C);
  ZS_CUDA_CHECK_LAUNCH();
}

template <class T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int Tn, int C,
                        cudaStream_t stream) {
  const int N = B * Tn;
  if (N == 0 || C == 0) return;
  // One workspace: the positions 0..N-1, the tokens and positions sorted by token, CUB's temporary storage.
  size_t sort_bytes = 0;
  ZS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, tokens, static_cast<int32_t*>(nullptr),
                                                static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), N, 0, 32, stream));
  const size_t ints_bytes = (size_t(N) * sizeof(int32_t) + 255) / 256 * 256;
  Buffer scratch = workspace(3 * ints_bytes + sort_bytes, stream);
  char* base = static_cast<char*>(scratch.data());
  auto* positions = reinterpret_cast<int32_t*>(base);
  auto* sorted_positions = reinterpret_cast<int32_t*>(base + ints_bytes);
  auto* sorted_tokens = reinterpret_cast<int32_t*>(base + 2 * ints_bytes);
  iota_kernel<<<grid_for(size_t(N)), kBlockSize, 0, stream>>>(positions, N);
  ZS_CUDA_CHECK_LAUNCH();
  ZS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + 3 * ints_bytes, sort_bytes, tokens, sorted_tokens,
                                                positions, sorted_positions, N, 0, 32, stream));
  wte_backward_kernel<<<unsigned(N), kWteThreads, 0, stream>>>(dwte, dout, sorted_tokens, sorted_positions, N,
                                                                C);
  ZS_CUDA_CHECK_LAUNCH();
  if (!dwpe) return;
  wpe_backward_kernel<<<grid_for(size_t(Tn) * C), kBlockSize, 0, stream>>>(dwpe, dout, B, Tn, C);
  ZS_CUDA_CHECK_LAUNCH();
}

#define ZS_INSTANTIATE(T)                                                                               \
  template void embedding_forward<T>(T*, const int32_t*, const T*, const T*, int, int, int, cudaStream_t); \
  template void embedding_backward<T>(T*, T*, const T*, const int32_t*, int, int, int, cudaStream_t);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

}  // namespace zshard::cuda
