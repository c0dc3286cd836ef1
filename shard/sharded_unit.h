// The inside of ShardedParams that its four source files share: a unit's buffers and state, and the
// dtype helpers. Included by shard/sharded_params.cpp (state and ownership), shard/param_gather.cpp
// (all-gather and prefetch), shard/grad_reduction.cpp (reduce-scatter and all-reduce) and
// shard/optimizer_step.cpp (norm and AdamW) only.
#pragma once
#include "kernels/engine_ops.h"
#include "shard/sharded_params.h"

namespace zshard {

struct ShardedParams::Unit {
  Unit(const UnitSpec& spec, int group, int pad_multiple) : layout(spec, group, pad_multiple) {}
  FlatLayout layout;
  Tensor resident;      // compute copy: the full flat buffer when resident, this rank's shard when sharded
  Tensor master;        // the fp32 owned shard; a view into `resident` when the param dtype is fp32
  Tensor gathered;      // sharded params: the all-gathered full buffer while the unit is in use
  comm::WorkPtr gather_work;
  int gather_refs = 0;  // gathers not yet released, on every strategy (the protocol is checked on all)
  bool used = false;    // the model has gathered it since it was last freed (a prefetch is not yet used)
  // Where the unit's gradients are in this micro-step: the protocol allows grads() any number of times,
  // then one grads_ready().
  enum class Grads { untouched, requested, ready } grads_state = Grads::untouched;
  UnitTensors param_views;
  Tensor grad_store;    // grads: full when resident (ddp, zero1), this rank's shard when sharded
  Tensor full_grads;    // what the model accumulates into: grad_store, or a transient full buffer
  UnitTensors grad_views;
  Tensor m, v;          // AdamW state of the owned shard
};

namespace sharded {
inline constexpr DType kF32 = DType::f32;

// Calls fn(T{}) with T the element type of `dtype` (float or bf16): where a runtime dtype picks an op's
// template argument.
template <class Fn>
decltype(auto) with_element_type(DType dtype, Fn&& fn) {
  if (dtype == DType::bf16) return fn(bf16{});
  ZS_CHECK(dtype == DType::f32, "parameters and gradients are f32 or bf16, not ", dtype_name(dtype));
  return fn(float{});
}

// This rank's shard of a unit buffer that holds either the full unit or that shard already.
inline Tensor owned_part(const FlatLayout& layout, int shard, const Tensor& buffer) {
  if (buffer.numel() != layout.padded_numel()) return buffer;
  return buffer.view(layout.shard_begin(shard), {layout.shard_numel()});
}

// dst += src, both on `device`; src is converted to dst's dtype first when they differ.
inline void accumulate(Device device, const Tensor& dst, Tensor src) {
  const size_t n = size_t(dst.numel());
  if (src.dtype() != dst.dtype()) {
    Tensor converted = Tensor::empty(dst.shape(), dst.dtype(), device, Category::comm);
    ops::convert(device, converted.raw(), dst.dtype(), src.raw(), src.dtype(), n);
    src = converted;
  }
  with_element_type(dst.dtype(), [&](auto t) {
    using T = decltype(t);
    ops::axpy(device, dst.data<T>(), src.data<T>(), 1.0f, n);
  });
}
}  // namespace sharded

}  // namespace zshard
