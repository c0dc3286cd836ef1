#include <zshard/testing.h>

#include <algorithm>
#include <type_traits>
#include <utility>

#include <zshard/error.h>

#include "kernels/device_memory.h"
#include "shard/frozen_params.h"

namespace zshard {

LocalParams::LocalParams(const Model& model, DType dtype, Device device, const std::vector<std::string>& freeze)
    : dtype_(dtype), device_(device) {
  const bool on_cpu = device == Device::cpu;
  ZS_CHECK(dtype == DType::f32 || dtype == DType::bf16 || (on_cpu && dtype == DType::f64),
           "LocalParams holds f32 or bf16, and f64 on cpu, not ", dtype_name(dtype), " on ", device_name(device));
  // The engine's own matching: the same patterns freeze the same parameters, and one matching none is refused.
  for (const UnitSpec& unit : freeze.empty() ? model.units() : freeze_matching(model.units(), freeze)) {
    UnitTensors params, grads;
    for (const ParamSpec& p : unit.params) {
      params.push_back(Tensor::zeros(p.shape, dtype, device, Category::params));
      grads.push_back(p.frozen ? Tensor() : Tensor::zeros(p.shape, dtype, device, Category::grads));
    }
    params_.push_back(std::move(params));
    grads_.push_back(std::move(grads));
  }
  gathered_.assign(params_.size(), 0);
  grads_state_.assign(params_.size(), Grads::untouched);
  for (const UnitTensors& unit : grads_)
    trainable_.push_back(std::any_of(unit.begin(), unit.end(), [](const Tensor& g) { return g.defined() && g.numel() > 0; }));
}

void LocalParams::init(const Model& model, uint64_t seed) {
  for (int u = 0; u < num_units(); ++u) model.init_unit(u, params_[u], seed);
}

void LocalParams::copy_params_from(const LocalParams& other) {
  ZS_CHECK(other.num_units() == num_units(), "copying ", other.num_units(), " units into ", num_units());
  for (int u = 0; u < num_units(); ++u) {
    ZS_CHECK(other.params_[u].size() == params_[u].size(), "unit ", u, ": param counts differ");
    for (size_t i = 0; i < params_[u].size(); ++i) {
      ZS_CHECK(other.params_[u][i].shape() == params_[u][i].shape(), "unit ", u, " param ", i,
               ": shapes differ");
      assign_doubles(params_[u][i], to_doubles(other.params_[u][i]));
    }
  }
}

void LocalParams::zero_grads() {
  for (UnitTensors& unit : grads_)
    for (Tensor& g : unit)
      if (g.defined()) g.zero_();
}

int LocalParams::count(Call call, int unit) const {
  return int(std::count_if(events_.begin(), events_.end(),
                           [&](const Event& e) { return e.call == call && e.unit == unit; }));
}

int LocalParams::checked(int unit) const {
  if (unit < 0 || unit >= num_units()) fail("unit ", unit, " out of range [0, ", num_units(), ")");
  return unit;
}

const UnitTensors& LocalParams::gather(int unit) {
  events_.push_back({Call::gather, checked(unit)});
  ++gathered_[unit];
  return params_[unit];
}

void LocalParams::release(int unit) {
  events_.push_back({Call::release, checked(unit)});
  if (gathered_[unit] <= 0) fail("release(", unit, ") without a matching gather");
  --gathered_[unit];
}

const UnitTensors& LocalParams::grads(int unit) {
  events_.push_back({Call::grads, checked(unit)});
  grads_state_[unit] = Grads::requested;  // after a grads_ready: the next micro-step's
  return grads_[unit];
}

void LocalParams::grads_ready(int unit) {
  events_.push_back({Call::grads_ready, checked(unit)});
  if (grads_state_[unit] == Grads::ready) fail("grads_ready(", unit, ") twice, with no grads() between");
  if (grads_state_[unit] != Grads::requested) fail("grads_ready(", unit, ") without grads()");
  grads_state_[unit] = Grads::ready;
}

void LocalParams::check_micro_step_closed(bool backward) {
  // The next micro-step starts clean whatever is found: gathers and gradients as the engine's own
  // abandoned micro-step leaves them.
  const std::vector<Grads> seen = std::exchange(grads_state_, std::vector<Grads>(grads_state_.size(), Grads::untouched));
  const std::vector<int> held = std::exchange(gathered_, std::vector<int>(gathered_.size(), 0));
  // In the engine's order: what the model left open, then what a backward never handed back.
  for (int u = 0; u < num_units(); ++u) {
    if (held[u] > 0) fail("unit ", u, " still gathered at the end of a micro-step");
    if (seen[u] == Grads::requested) fail("unit ", u, ": grads() without grads_ready() in this micro-step");
  }
  for (int u = 0; u < num_units(); ++u)
    if (backward && trainable_[u] && seen[u] != Grads::ready)
      fail("unit ", u, ": no grads_ready() in this micro-step's backward (every unit with trainable parameters ",
           "hands back its gradients, zero where it was not used)");
}

namespace {

// Calls f(T{}) with T the element type of `dtype`.
template <class F>
void with_test_element_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    case DType::bf16: return f(bf16{});
    default: fail("test tensors hold f32, f64 or bf16, not ", dtype_name(dtype));
  }
}

// t itself on the host; for a device tensor a host tensor of its shape and dtype, holding its values
// when `fetch`.
Tensor on_host(const Tensor& t, bool fetch) {
  if (t.device() == Device::cpu) return t;
  Tensor host = Tensor::empty(t.shape(), t.dtype(), Device::cpu, t.category());
  if (fetch) copy_bytes(host.raw(), Device::cpu, t.raw(), t.device(), t.nbytes());
  return host;
}

}  // namespace

std::vector<double> to_doubles(const Tensor& t) {
  const Tensor host = on_host(t, true);
  std::vector<double> out(size_t(t.numel()));
  with_test_element_type(t.dtype(), [&]<class T>(T) {
    std::transform(host.data<T>(), host.data<T>() + t.numel(), out.begin(), [](T v) {
      if constexpr (std::is_same_v<T, bf16>) return double(float(v));
      else return double(v);
    });
  });
  return out;
}

void assign_doubles(const Tensor& t, const std::vector<double>& values) {
  ZS_CHECK(int64_t(values.size()) == t.numel(), "assigning ", values.size(), " values to a tensor of ",
           t.numel());
  const Tensor host = on_host(t, false);
  with_test_element_type(t.dtype(), [&]<class T>(T) {
    std::transform(values.begin(), values.end(), host.data<T>(), [](double v) {
      if constexpr (std::is_same_v<T, bf16>) return bf16(float(v));
      else return T(v);
    });
  });
  if (t.device() != Device::cpu) copy_bytes(t.raw(), t.device(), host.raw(), Device::cpu, t.nbytes());
}

}  // namespace zshard
