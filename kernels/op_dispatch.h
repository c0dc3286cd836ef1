// How an op picks its backend: the CPU reference op (kernels/cpu/ops.h) or its CUDA twin
// (kernels/cuda/ops.cuh), by the Device its data lives on. Shared by the model ops (kernels/ops.cpp,
// fused_ops.cpp) and the engine's (kernels/engine_ops.cpp); included by those files only.
#pragma once
#include <type_traits>

#ifdef ZSHARD_WITH_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/runtime.h"
#endif

#include <zshard/dtype.h>
#include <zshard/error.h>

#include "kernels/cpu/ops.h"

namespace zshard::ops::dispatch {

template <class T>
constexpr bool kOnCpu = std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bf16>;
template <class T>
constexpr bool kOnCuda = std::is_same_v<T, float> || std::is_same_v<T, bf16>;

// True for cpu, false for cuda; throws when this build or this element type cannot run there, so that
// each op below only has to place the two calls.
template <class T>
bool on_cpu(Device d, const char* op) {
  if (d == Device::cpu) {
    if (!kOnCpu<T>) fail(op, ": ", dtype_name(dtype_of<T>()), " is computed on cuda only (cpu: f32, f64, bf16)");
    return true;
  }
#ifndef ZSHARD_WITH_CUDA
  fail(op, ": this zshard was built without the CUDA path (configure with -DZSHARD_CUDA=ON)");
#endif
  if (!kOnCuda<T>) fail(op, ": ", dtype_name(dtype_of<T>()), " is computed on cpu only (cuda: f32, bf16)");
  return false;
}

#ifdef ZSHARD_WITH_CUDA
static_assert(sizeof(bf16) == sizeof(__nv_bfloat16), "bf16 and __nv_bfloat16 must share their bits");

// zshard::bf16 storage seen as CUDA's type; other pointers pass through.
template <class T>
auto* dev(T* p) {
  if constexpr (std::is_same_v<std::remove_const_t<T>, bf16>) {
    using U = std::conditional_t<std::is_const_v<T>, const __nv_bfloat16, __nv_bfloat16>;
    return reinterpret_cast<U*>(p);
  } else {
    return p;
  }
}
#define ZS_ON_CUDA(T, ...) \
  if constexpr (kOnCuda<T>) { __VA_ARGS__; }
#else
#define ZS_ON_CUDA(T, ...)
#endif

#define ZS_ON_CPU(T, ...) \
  if constexpr (kOnCpu<T>) { __VA_ARGS__; }

// A scalar as the CPU op of T takes it: fp32 for bf16, as on cuda (kernels/cpu/ops.h).
template <class T>
cpu::Compute<T> cpu_scalar(float x) {
  return cpu::Compute<T>(x);
}

}  // namespace zshard::ops::dispatch
