// What the hand-written models (GPT-2, Llama) share, kept out of the model API itself: parameter init from
// a seed alone, the checks of a batch, the dispatch on the context's compute dtype, and the layout of
// activation buffers in one allocation per dtype.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <zshard/error.h>
#include <zshard/model.h>
#include <zshard/tensor.h>

#include "kernels/copy_stream.h"

namespace zshard {

// A parameter with its initial distribution: mean + std * N(0, 1) (std 0: the constant mean), or with
// init_bound > 0 uniform on [-init_bound, init_bound) (LoRA's A, models/lora.h).
struct ParamDef {
  ParamSpec spec;
  double init_mean;
  double init_std;
  double init_bound = 0;
  // The random stream that fills it; -1: its index in the unit. A parameter added beside others (a LoRA
  // adapter) takes a stream of its own, so that it changes none of theirs.
  int64_t stream = -1;
};
// Fills a unit's host tensors (f32 or f64) from `defs`. The values depend on (seed, unit, stream) only,
// never on the world size or a standard library's distributions; f32 gets the f64 values rounded.
void init_params(const std::string& model, const std::vector<ParamDef>& defs, const UnitTensors& params,
                 int unit, uint64_t seed);

// The units of a model whose unit u is called name(u) and holds the parameters defs(u).
std::vector<UnitSpec> units_from_defs(int num_units, const std::function<std::string(int)>& name,
                                      const std::function<std::vector<ParamDef>(int)>& defs);

// Refuses a configuration far beyond any real model, whose int64 parameter count would overflow (so
// `params` is counted in double) or whose units (one per layer) would take forever to build; errors start
// with `what` ("GPT-2 config").
void check_model_size(const std::string& what, int layers, double params);


// Calls run(T{}) with T the context's compute type: float, double (cpu only) or bf16.
template <class Run>
double with_compute_type(const std::string& model, const ParamContext& ctx, Run&& run) {
  const DType dtype = ctx.compute_dtype();
  const bool on_cpu = ctx.device() == Device::cpu;
  if (dtype == DType::f32) return run(float{});
  if (dtype == DType::f64 && on_cpu) return run(double{});
  if (dtype == DType::bf16) return run(bf16{});
  fail(model, " computes in f32 or bf16, and in f64 on cpu, not in ", dtype_name(dtype), " on ",
       device_name(ctx.device()));
}

// A model's activations as a list of buffers: `list(visit)` calls visit(view, shape, dtype) for every
// buffer, in order, the same way each time.
using BufferVisitor = std::function<void(Tensor& view, const Shape& shape, DType dtype)>;
using BufferList = std::function<void(const BufferVisitor& visit)>;
// Bytes allocate_buffers takes for the list: each buffer rounded up so that the next starts 128-byte
// aligned (the GEMMs' fast kernels want aligned rows).
int64_t buffer_bytes(const BufferList& list);
// One tracking-allocator Tensor per dtype (Category::activations), in order of first appearance, and
// every view cut from it. Returns the storage, which the views borrow.
std::vector<Tensor> allocate_buffers(const BufferList& list, Device device);
// Buffers that are never live at the same time share bytes: lists of them are cut from one region (of
// their dtype), each from its start. buffer_elements sizes a list as allocate_buffers lays it out;
// cut_buffers cuts its views from the region.
int64_t buffer_elements(const BufferList& list);
void cut_buffers(const Tensor& region, const BufferList& list);

// What every model's activations share: the batch shape, dtype and device they were made for, their
// storage (one allocation per dtype) and the batch's tokens on the device. Models derive their buffers.
struct BatchBuffers {
  int B = 0, T = 0;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  Recompute recompute = Recompute::none;
  AttentionKernel attention = AttentionKernel::blocks;
  std::vector<Tensor> storage;
  Tensor inputs, targets;  // (B,T) i32
  // On a device: page-locked host memory the batch's tokens pass through (a copy from pageable memory
  // would wait for the device), then the stream that copies them.
  Tensor staging;
  std::unique_ptr<CopyStream> token_copies;  // last: waits for its copies before the buffers above go

  // Slots of a buffer of per-block intermediates: one per block, or with recomputation one that every
  // block reuses (in its forward and in its recompute). Block inputs keep one per block either way.
  static int64_t slots(Recompute mode, int layers) {
    return mode == Recompute::blocks ? 1 : layers;
  }
  // The slot of block `layer`'s intermediates.
  int slot(int layer) const { return recompute == Recompute::blocks ? 0 : layer; }
  // True when these buffers serve `batch` in `type` on `dev` with `mode` and `kernel` as they are.
  bool fits(const Batch& batch, DType type, Device dev, Recompute mode, AttentionKernel kernel) const;
  // Records the shape and allocates every buffer `list` visits (the tokens among them).
  void allocate(int b, int t, DType type, Device dev, Recompute mode, AttentionKernel kernel, const BufferList& list);
  // Copies the batch's host tokens into inputs and targets without draining the compute stream: on a copy
  // stream, after the work queued so far (the last micro-step's kernels read the tokens), with the compute
  // stream waiting for the copies. On a device the host writes the staging only once the last copy out of
  // it is done; on the cpu, or from page-locked memory, the batch itself is the source.
  void load_tokens(const Batch& batch);
};

// Model FLOPs of the parameters' matmuls per token, forward and backward: 6 per trained parameter, 4 per
// frozen one, whose weight-gradient matmul backward skips (it still passes the input gradient on).
double parameter_flops(const std::vector<UnitSpec>& units);

// Slice i of a buffer with a leading layer (or slot) dimension.
template <class T>
T* slice(const Tensor& t, int64_t i) {
  return t.data<T>() + i * (t.numel() / t.dim(0));
}

}  // namespace zshard
