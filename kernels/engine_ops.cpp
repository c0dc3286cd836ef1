#include "kernels/engine_ops.h"

#include <initializer_list>
#include <utility>
#include <vector>

#include "kernels/device_memory.h"
#include "kernels/op_dispatch.h"
#include "kernels/quantize_blocks.h"
#include "kernels/test_hooks.h"

namespace zshard::ops {

using namespace dispatch;

template <class G>
void adamw_step(Device d, float* param, const G* grad, float* m, float* v, std::span<const ShardSegment> segments,
                const StepScalars* step, bf16* param_bf16) {
  // The host steps bf16 gradients too: --offload optimizer brings them from a device in the compute dtype.
  if (d == Device::cpu) {
    if (step->skip) return;
    for (const ShardSegment& s : segments)
      cpu::adamw_update(param + s.begin, grad + s.begin, m + s.begin, v + s.begin, s.count, step->settings.adamw,
                        s.weight_decay, float(step->grad_scale), param_bf16 ? param_bf16 + s.begin : nullptr);
    return;
  }
  on_cpu<G>(d, "adamw_step");
  ZS_ON_CUDA(G, cuda::adamw_step(param, dev(grad), m, v, segments, step, dev(param_bf16)))
}

void set_step_settings(Device d, StepScalars* step, const cpu::StepSettings* settings) {
  if (on_cpu<float>(d, "set_step_settings")) {
    step->settings = *settings;
    return;
  }
#ifdef ZSHARD_WITH_CUDA
  ZS_CUDA_CHECK(cudaMemcpyAsync(&step->settings, settings, sizeof *settings, cudaMemcpyHostToDevice,
                                cuda::compute_stream()));
#endif
}

template <class T>
void sum_squares(Device d, double* sum, std::span<const std::span<const T>> parts) {
  if (on_cpu<T>(d, "sum_squares")) {
    ZS_ON_CPU(T, {
      for (std::span<const T> part : parts) *sum += cpu::sum_squares(part.data(), part.size());
    })
  } else {
    ZS_ON_CUDA(T, {
      using U = std::remove_pointer_t<decltype(dev(static_cast<const T*>(nullptr)))>;
      std::vector<std::span<U>> device_parts;
      for (std::span<const T> part : parts) device_parts.emplace_back(dev(part.data()), part.size());
      cuda::sum_squares<std::remove_const_t<U>>(sum, device_parts);
    })
  }
}

void sum_in_order(Device d, double* sum, const double* values, size_t n, double first) {
  if (on_cpu<float>(d, "sum_in_order")) {  // the device check; the values are doubles on either side
    *sum = cpu::sum_in_order(values, n, first);
    return;
  }
#ifdef ZSHARD_WITH_CUDA
  cuda::sum_in_order(sum, values, n, first);
#endif
}

void clip_grad_norm(Device d, StepScalars* step) {
  if (on_cpu<float>(d, "clip_grad_norm")) {
    cpu::clip_grad_norm(*step);
    return;
  }
#ifdef ZSHARD_WITH_CUDA
  cuda::clip_grad_norm(step);
#endif
}

template <class T>
void axpy(Device d, T* y, const T* x, float alpha, size_t n) {
  if (on_cpu<T>(d, "axpy")) {
    ZS_ON_CPU(T, cpu::axpy(y, x, cpu_scalar<T>(alpha), n))
  } else {
    ZS_ON_CUDA(T, cuda::axpy(dev(y), dev(x), alpha, n))
  }
}

void convert(Device d, void* dst, DType dst_type, const void* src, DType src_type, size_t n) {
  const bool known = (dst_type == DType::f32 || dst_type == DType::bf16) &&
                     (src_type == DType::f32 || src_type == DType::bf16);
  ZS_CHECK(known, "convert: f32 and bf16 only, not ", dtype_name(src_type), " -> ", dtype_name(dst_type));
  // The device check first, so that a build without CUDA says so whichever types are asked for.
  const bool cpu = on_cpu<float>(d, "convert");
  if (dst_type == src_type) {
    copy_bytes(dst, d, src, d, n * dtype_size(dst_type));
    return;
  }
  const bool to_bf16 = dst_type == DType::bf16;
  if (cpu) {
    if (to_bf16) {
      for (size_t i = 0; i < n; ++i) static_cast<bf16*>(dst)[i] = bf16(static_cast<const float*>(src)[i]);
    } else {
      for (size_t i = 0; i < n; ++i) static_cast<float*>(dst)[i] = float(static_cast<const bf16*>(src)[i]);
    }
    return;
  }
#ifdef ZSHARD_WITH_CUDA
  if (to_bf16) {
    cuda::convert(static_cast<__nv_bfloat16*>(dst), static_cast<const float*>(src), n);
  } else {
    cuda::convert(static_cast<float*>(dst), static_cast<const __nv_bfloat16*>(src), n);
  }
#endif
}

namespace {

void check_format(const char* op, QuantFormat f) {
  ZS_CHECK(f.block >= 1, op, ": block must be at least 1, not ", f.block);
  ZS_CHECK(f.bits == 8 || f.bits == 4, op, ": bits must be 8 or 4, not ", f.bits);
}

// The format, the table's agreement with it, then every array of n > 0 elements given, by name.
void check_quantized_arrays(const char* op, size_t n, QuantFormat f, BlockTable blocks,
                            std::initializer_list<std::pair<const char*, const void*>> arrays) {
  check_format(op, f);
  ZS_CHECK(n == 0 || blocks.block == f.block, op, ": a block table cut for blocks of ", blocks.block,
           " with a format of blocks of ", f.block);
  for (const auto& [name, pointer] : arrays) ZS_CHECK(n == 0 || pointer, op, ": ", name, " is null for n = ", n);
}

}  // namespace

HostBlockTable::HostBlockTable(const std::vector<int64_t>& piece_begin, QuantFormat f)
    : pieces_(int(piece_begin.size()) - 1), block_(f.block) {
  check_format("block table", f);
  ZS_CHECK(!piece_begin.empty() && piece_begin.front() == 0, "block table: the first piece must begin at 0");
  entries_ = piece_begin;
  int64_t blocks = 0;
  for (int p = 0; p < pieces_; ++p) {
    const int64_t length = piece_begin[size_t(p) + 1] - piece_begin[size_t(p)];
    ZS_CHECK(length > 0, "block table: piece ", p, " begins at ", piece_begin[size_t(p)], " and ends at ",
             piece_begin[size_t(p) + 1]);
    entries_.push_back(blocks);
    blocks += (length + f.block - 1) / f.block;
  }
  entries_.push_back(blocks);
}

QuantizedSize quantized_size(size_t n, int bits, size_t blocks) {
  check_format("quantized_size", {1, bits});
  return {quant::payload_bytes(n, bits), blocks};
}

QuantizedSize quantized_size(size_t n, QuantFormat f) {
  check_format("quantized_size", f);
  return quantized_size(n, f.bits, (n + size_t(f.block) - 1) / size_t(f.block));
}

template <class T>
void quantize_blocks(Device d, int8_t* q, float* scales, const T* x, size_t n, QuantFormat f, BlockTable blocks) {
  check_quantized_arrays("quantize_blocks", n, f, blocks,
                         {{"q", q}, {"scales", scales}, {"x", x}, {"block table", blocks.piece_begin}});
  if (on_cpu<T>(d, "quantize_blocks")) {
    cpu::quantize_blocks(q, scales, x, n, f, blocks);
  } else {
    ZS_ON_CUDA(T, cuda::quantize_blocks(q, scales, dev(x), n, f, blocks))
  }
}

template <class T>
void dequantize_blocks(Device d, T* out, const int8_t* q, const float* scales, size_t n, QuantFormat f,
                       BlockTable blocks, bool accumulate) {
  check_quantized_arrays("dequantize_blocks", n, f, blocks,
                         {{"out", out}, {"q", q}, {"scales", scales}, {"block table", blocks.piece_begin}});
  if (on_cpu<T>(d, "dequantize_blocks")) {
    cpu::dequantize_blocks(out, q, scales, n, f, blocks, accumulate);
  } else {
    ZS_ON_CUDA(T, cuda::dequantize_blocks(dev(out), q, scales, n, f, blocks, accumulate))
  }
}

void synchronize(Device d) {
  count_device_wait();
  if (d == Device::cpu) return;
  on_cpu<float>(d, "synchronize");
#ifdef ZSHARD_WITH_CUDA
  cuda::synchronize_stream(cuda::compute_stream());  // which waited for every collective it used
#endif
}

void read_back(Device d, void* host, const void* src, size_t bytes) {
  count_device_wait();
  // A copy to the host polls the compute stream first (copy_bytes), like synchronize().
  copy_bytes(host, Device::cpu, src, d, bytes);
}

#define ZS_INSTANTIATE(T)                                                                    \
  template void sum_squares<T>(Device, double*, std::span<const std::span<const T>>); \
  template void axpy<T>(Device, T*, const T*, float, size_t);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(double)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

#define ZS_INSTANTIATE(G)                                                                                  \
  template void adamw_step<G>(Device, float*, const G*, float*, float*, std::span<const ShardSegment>, \
                              const StepScalars*, bf16*);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

#define ZS_INSTANTIATE(T)                                                                                \
  template void quantize_blocks<T>(Device, int8_t*, float*, const T*, size_t, QuantFormat, BlockTable);  \
  template void dequantize_blocks<T>(Device, T*, const int8_t*, const float*, size_t, QuantFormat, BlockTable, bool);
ZS_INSTANTIATE(float)
ZS_INSTANTIATE(bf16)
#undef ZS_INSTANTIATE

}  // namespace zshard::ops
