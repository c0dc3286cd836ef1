// The ops the sharding engine calls and a model never does: AdamW on owned shards, the gradient norm's
// sum of squares, accumulation, dtype conversion and the host's wait for the device. Dispatched on the
// device like the model ops (<zshard/ops.h>), whose conventions they share.
#pragma once
#include <cstddef>
#include <span>

#include <zshard/dtype.h>

#include "kernels/cpu/ops.h"

namespace zshard::ops {

using cpu::AdamWParams;

// AdamW on an fp32 master shard with gradients G (float or bf16). param_bf16, when given, receives the
// bf16 compute copy of the updated parameters in the same pass (on cpu it may alias grad: kernels/cpu/ops.h).
template <class G>
void adamw_step(Device d, float* param, const G* grad, float* m, float* v, size_t n, const AdamWParams& hp,
                bf16* param_bf16 = nullptr);
// Sum of squares of every element of every part, accumulated in double. On cuda the parts are reduced
// one after another on the device and the host waits once, for all of them (the gradient norm sums over
// every parameter of every unit).
template <class T>
double sum_squares(Device d, std::span<const std::span<const T>> parts);
// y += alpha * x
template <class T>
void axpy(Device d, T* y, const T* x, float alpha, size_t n);

// dst[i] = src[i] converted between f32 and bf16 (rounding to nearest even), or copied when the types
// match. Both arrays on `d`.
void convert(Device d, void* dst, DType dst_type, const void* src, DType src_type, size_t n);

// Blocks the host until every op queued on the device has finished (nothing to do on cpu). Timers and
// host reads of device results go through here.
void synchronize(Device d);

}  // namespace zshard::ops
