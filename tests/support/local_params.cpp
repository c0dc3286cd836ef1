#include "tests/support/local_params.h"

#include <algorithm>

#include "kernels/error.h"

namespace zshard::test {

LocalParams::LocalParams(const Model& model, DType dtype) : dtype_(dtype) {
  ZS_CHECK(dtype == DType::f32 || dtype == DType::f64, "LocalParams holds f32 or f64, not ",
           dtype_name(dtype));
  for (const UnitSpec& unit : model.units()) {
    UnitTensors params, grads;
    for (const ParamSpec& p : unit.params) {
      params.push_back(Tensor::zeros(p.shape, dtype, Device::cpu, Category::params));
      grads.push_back(Tensor::zeros(p.shape, dtype, Device::cpu, Category::grads));
    }
    params_.push_back(std::move(params));
    grads_.push_back(std::move(grads));
  }
  gathered_.assign(params_.size(), 0);
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
    for (Tensor& g : unit) g.zero_();
}

int LocalParams::count(Call call, int unit) const {
  return int(std::count_if(events_.begin(), events_.end(),
                           [&](const Event& e) { return e.call == call && e.unit == unit; }));
}

int LocalParams::checked(int unit) const {
  ZS_CHECK(unit >= 0 && unit < num_units(), "unit ", unit, " out of range [0, ", num_units(), ")");
  return unit;
}

const UnitTensors& LocalParams::gather(int unit) {
  events_.push_back({Call::gather, checked(unit)});
  ++gathered_[unit];
  return params_[unit];
}

void LocalParams::release(int unit) {
  events_.push_back({Call::release, checked(unit)});
  ZS_CHECK(gathered_[unit] > 0, "release(", unit, ") without a matching gather");
  --gathered_[unit];
}

const UnitTensors& LocalParams::grads(int unit) {
  events_.push_back({Call::grads, checked(unit)});
  return grads_[unit];
}

void LocalParams::grads_ready(int unit) { events_.push_back({Call::grads_ready, checked(unit)}); }

std::vector<double> to_doubles(const Tensor& t) {
  std::vector<double> out(size_t(t.numel()));
  if (t.dtype() == DType::f64) std::copy_n(t.data<double>(), t.numel(), out.begin());
  else std::copy_n(t.data<float>(), t.numel(), out.begin());
  return out;
}

void assign_doubles(const Tensor& t, const std::vector<double>& values) {
  ZS_CHECK(int64_t(values.size()) == t.numel(), "assigning ", values.size(), " values to a tensor of ",
           t.numel());
  if (t.dtype() == DType::f64) std::copy(values.begin(), values.end(), t.data<double>());
  else std::transform(values.begin(), values.end(), t.data<float>(), [](double v) { return float(v); });
}

}  // namespace zshard::test
