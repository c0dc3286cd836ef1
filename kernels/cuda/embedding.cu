// Token + position embedding, forward and backward; the position table is optional (Llama has none): a
// null wpe adds nothing, a null dwpe gets nothing, and a null dwte (a frozen table) neither. The backward is
// deterministic.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>

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

// A dwte row is the sum over every position holding its token. The positions are sorted by token (a
// stable radix sort) and cut into runs of one token (run-length encoding, an exclusive scan of the run
// lengths giving each run's first sorted position). A block takes a run at a time, grid-stride over the
// runs, so the grid fills the GPU once whatever the number of distinct tokens: its warps take the run's
// rows in turn, lanes take columns, the warps' partial sums meet in shared memory in a fixed order, and
// the row is rounded into dwte once. Deterministic, and a frequent token (a space in byte data is a sixth
// of all positions) is walked by 32 warps, not serially. Atomics would vary the order and, in bf16, round
// a running sum at every one of that token's additions.
constexpr int kWteThreads = 1024;
constexpr int kWarpsPerBlock = kWteThreads / kWarpSize;
constexpr int kWteBlocksPerSm = 2;  // 2048 resident threads per SM from sm_80 on

// __launch_bounds__: the compiler must keep registers within what 1024 threads per block can have.
template <class T>
__global__ void __launch_bounds__(kWteThreads)
    wte_backward_kernel(T* dwte, const T* dout, const int32_t* run_tokens, const int32_t* run_starts,
                        const int32_t* run_lengths, const int32_t* runs, const int32_t* sorted_positions, int C) {
  __shared__ float partial[kWarpsPerBlock][kWarpSize];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  for (int r = blockIdx.x; r < *runs; r += gridDim.x) {
    const int32_t token = run_tokens[r];
    const int first = run_starts[r], end = first + run_lengths[r];
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
}

// Blocks of the dwte kernel: at most one per position (a run each), at most what the GPU holds at once.
unsigned wte_blocks(int N) {
  static const int sms = [] {
    int device = 0, count = 0;
    ZS_CUDA_CHECK(cudaGetDevice(&device));
    ZS_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  }();
  return unsigned(std::max(1, std::min(N, kWteBlocksPerSm * sms)));
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

// dwte's rows: the positions sorted by token and summed a run at a time (wte_backward_kernel).
template <class T>
void wte_backward(T* dwte, const T* dout, const int32_t* tokens, int N, int C, cudaStream_t stream) {
  // One workspace: seven arrays of N ints (the positions 0..N-1, the tokens and positions sorted by token,
  // each run's token, length and first sorted position, the number of runs) and CUB's temporary storage,
  // as large as the largest of its three passes needs.
  int32_t* null = nullptr;
  size_t sort_bytes = 0, encode_bytes = 0, scan_bytes = 0;
  ZS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, tokens, null, static_cast<const int32_t*>(null),
                                                null, N, 0, 32, stream));
  ZS_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(nullptr, encode_bytes, null, null, null, null, N, stream));
  ZS_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, null, null, N, stream));
  const size_t temp_bytes = std::max({sort_bytes, encode_bytes, scan_bytes});
  const size_t ints_bytes = (size_t(N) * sizeof(int32_t) + 255) / 256 * 256;
  Buffer scratch = workspace(7 * ints_bytes + temp_bytes, stream);
  char* base = static_cast<char*>(scratch.data());
  const auto ints = [&](int i) { return reinterpret_cast<int32_t*>(base + size_t(i) * ints_bytes); };
  int32_t *positions = ints(0), *sorted_positions = ints(1), *sorted_tokens = ints(2), *run_tokens = ints(3),
          *run_lengths = ints(4), *run_starts = ints(5), *runs = ints(6);
  void* temp = base + 7 * ints_bytes;
  iota_kernel<<<grid_for(size_t(N)), kBlockSize, 0, stream>>>(positions, N);
  ZS_CUDA_CHECK_LAUNCH();
  ZS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, sort_bytes, tokens, sorted_tokens, positions,
                                                sorted_positions, N, 0, 32, stream));
  // The scan reads all N lengths, the kernel only the first *runs: the rest are zeroed, not left unset.
  ZS_CUDA_CHECK(cudaMemsetAsync(run_lengths, 0, size_t(N) * sizeof(int32_t), stream));
  ZS_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(temp, encode_bytes, sorted_tokens, run_tokens, run_lengths,
                                                   runs, N, stream));
  ZS_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp, scan_bytes, run_lengths, run_starts, N, stream));
  wte_backward_kernel<<<wte_blocks(N), kWteThreads, 0, stream>>>(dwte, dout, run_tokens, run_starts, run_lengths,
                                                                 runs, sorted_positions, C);
  ZS_CUDA_CHECK_LAUNCH();
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
  if (dwte) wte_backward(dwte, dout, tokens, N, C, stream);
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
