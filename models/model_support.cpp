#include "models/model_support.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "kernels/device_memory.h"

namespace zshard {

namespace {

uint64_t mix64(uint64_t z) {  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// N(0, 1) samples from splitmix64 and Box-Muller, and uniform ones, written out so that the values depend
// on nothing but the seed (not on a standard library's distributions).
class NormalStream {
 public:
  NormalStream(uint64_t seed, int unit, int64_t stream)
      : state_(mix64(mix64(mix64(seed) ^ uint64_t(unit)) ^ uint64_t(stream))) {}

  double uniform() { return double(next_u64() >> 11) * 0x1p-53; }  // [0, 1)

  double next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = double((next_u64() >> 11) + 1) * 0x1p-53;  // (0, 1]: log(u1) is finite
    const double u2 = double(next_u64() >> 11) * 0x1p-53;        // [0, 1)
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double theta = 2.0 * std::numbers::pi * u2;
    spare_ = r * std::sin(theta);
    has_spare_ = true;
    return r * std::cos(theta);
  }

 private:
  uint64_t next_u64() { return mix64(state_ += 0x9e3779b97f4a7c15ull); }

  uint64_t state_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

template <class T>
void fill(const Tensor& t, const ParamDef& def, NormalStream& rng) {
  T* x = t.data<T>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (def.init_bound > 0) x[i] = T(def.init_bound * (2.0 * rng.uniform() - 1.0));
    else x[i] = T(def.init_std == 0.0 ? def.init_mean : def.init_mean + def.init_std * rng.next());
  }
}

int64_t footprint(const Shape& shape) { return (shape_numel(shape) + 63) / 64 * 64; }

}  // namespace

void init_params(const std::string& model, const std::vector<ParamDef>& defs, const UnitTensors& params,
                 int unit, uint64_t seed) {
  ZS_CHECK(params.size() == defs.size(), model, " unit ", unit, " has ", defs.size(), " params, got ",
           params.size(), " tensors");
  for (size_t i = 0; i < defs.size(); ++i) {
    const Tensor& t = params[i];
    ZS_CHECK(t.shape() == defs[i].spec.shape, defs[i].spec.name, ": expected shape ", shape_str(defs[i].spec.shape),
             ", got ", shape_str(t.shape()));
    ZS_CHECK(t.device() == Device::cpu, defs[i].spec.name, ": init_unit fills host tensors only");
    NormalStream rng(seed, unit, defs[i].stream < 0 ? int64_t(i) : defs[i].stream);
    switch (t.dtype()) {
      case DType::f32: fill<float>(t, defs[i], rng); break;
      case DType::f64: fill<double>(t, defs[i], rng); break;
      default: fail(defs[i].spec.name, ": init_unit fills f32 or f64, not ", dtype_name(t.dtype()));
    }
  }
}

std::vector<UnitSpec> units_from_defs(int num_units, const std::function<std::string(int)>& name,
                                      const std::function<std::vector<ParamDef>(int)>& defs) {
  std::vector<UnitSpec> units;
  for (int u = 0; u < num_units; ++u) {
    UnitSpec unit{name(u), {}};
    for (ParamDef& def : defs(u)) unit.params.push_back(std::move(def.spec));
    units.push_back(std::move(unit));
  }
  return units;
}

void check_model_size(const std::string& what, int layers, double params) {
  constexpr int kMaxLayers = 1 << 16;
  constexpr double kMaxParams = 1e15;
  if (layers > kMaxLayers) fail(what, ": layers must be at most ", kMaxLayers, ", got ", layers);
  if (params > kMaxParams) fail(what, ": ", params, " parameters, more than ", kMaxParams);
}

double parameter_flops(const std::vector<UnitSpec>& units) {
  double flops = 0;
  for (const UnitSpec& unit : units)
    for (const ParamSpec& p : unit.params) flops += (p.frozen ? 4.0 : 6.0) * double(p.numel());
  return flops;
}

int64_t buffer_bytes(const BufferList& list) {
  int64_t total = 0;
  list([&](Tensor&, const Shape& shape, DType type) { total += footprint(shape) * int64_t(dtype_size(type)); });
  return total;
}

std::vector<Tensor> allocate_buffers(const BufferList& list, Device device) {
  // Count, allocate, then cut the views.
  std::vector<DType> dtypes;
  std::vector<int64_t> numel;
  const auto slot = [&](DType type) {
    const size_t s = size_t(std::find(dtypes.begin(), dtypes.end(), type) - dtypes.begin());
    if (s == dtypes.size()) {
      dtypes.push_back(type);
      numel.push_back(0);
    }
    return s;
  };
  list([&](Tensor&, const Shape& shape, DType type) { numel[slot(type)] += footprint(shape); });
  std::vector<Tensor> storage;
  for (size_t s = 0; s < dtypes.size(); ++s)
    storage.push_back(Tensor::empty({numel[s]}, dtypes[s], device, Category::activations));
  std::vector<int64_t> offset(dtypes.size(), 0);
  list([&](Tensor& view, const Shape& shape, DType type) {
    const size_t s = slot(type);
    view = storage[s].view(offset[s], shape);
    offset[s] += footprint(shape);
  });
  return storage;
}

int64_t buffer_elements(const BufferList& list) {
  int64_t total = 0;
  list([&](Tensor&, const Shape& shape, DType) { total += footprint(shape); });
  return total;
}

void cut_buffers(const Tensor& region, const BufferList& list) {
  int64_t offset = 0;
  list([&](Tensor& view, const Shape& shape, DType type) {
    ZS_CHECK(type == region.dtype(), "a shared activation region of ", dtype_name(region.dtype()), " cannot hold ",
             dtype_name(type));
    view = region.view(offset, shape);
    offset += footprint(shape);
  });
}

bool BatchBuffers::fits(const Batch& batch, DType type, Device dev, Recompute mode, AttentionKernel kernel) const {
  return !storage.empty() && B == batch.B && T == batch.T && dtype == type && device == dev &&
         recompute == mode && attention == kernel;
}

void BatchBuffers::allocate(int b, int t, DType type, Device dev, Recompute mode, AttentionKernel kernel,
                            const BufferList& list) {
  B = b;
  T = t;
  dtype = type;
  device = dev;
  recompute = mode;
  attention = kernel;
  storage = allocate_buffers(list, device);
  token_copies = CopyStream::make(device, 1);
  if (device != Device::cpu) staging = Tensor::empty({2, b, t}, DType::i32, Device::cpu, Category::host);
}

void BatchBuffers::load_tokens(const Batch& batch) {
  ZS_CHECK(batch.B == B && batch.T == T, "activations are for B=", B, " T=", T, ", the batch has B=", batch.B,
           " T=", batch.T);
  const size_t n = size_t(B) * T;
  const int32_t* in = batch.inputs;
  const int32_t* out = batch.targets;
  // Tokens already in page-locked memory are copied from where they are: an engine that replays its steps
  // as CUDA graphs (shard/step_graph.h) rewrites those buffers between replays, and a replay copies from
  // the addresses its capture saw.
  if (staging.defined() && !(page_locked(in) && page_locked(out))) {
    token_copies->host_waits(0);
    int32_t* staged = staging.data<int32_t>();
    std::copy(batch.inputs, batch.inputs + n, staged);
    std::copy(batch.targets, batch.targets + n, staged + n);
    in = staged;
    out = staged + n;
  }
  token_copies->follow_compute();
  token_copies->copy(inputs.raw(), device, in, Device::cpu, inputs.nbytes());
  token_copies->copy(targets.raw(), device, out, Device::cpu, targets.nbytes());
  token_copies->set_mark(0);
  token_copies->compute_waits(0);
}

}  // namespace zshard
