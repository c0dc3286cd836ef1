// LocalParams: a single-process ParamContext for tests. It holds every unit's full parameters and
// gradients as separate host tensors of one dtype, and records each protocol call so that tests can
// check how a model uses gather/release/grads/grads_ready.
#pragma once
#include <cstdint>
#include <vector>

#include "models/model.h"

namespace zshard::test {

class LocalParams final : public ParamContext {
 public:
  enum class Call { gather, release, grads, grads_ready };
  struct Event {
    Call call;
    int unit;
  };

  // Parameters and gradients zero-filled in `dtype` (f32 or f64) on the CPU.
  LocalParams(const Model& model, DType dtype);

  // Fills every unit with model.init_unit(u, ..., seed).
  void init(const Model& model, uint64_t seed);
  // Copies another context's parameters, converting the dtype.
  void copy_params_from(const LocalParams& other);
  void zero_grads();

  // Direct access for tests; not protocol calls.
  int num_units() const { return int(params_.size()); }
  const UnitTensors& param_tensors(int unit) const { return params_.at(unit); }
  const UnitTensors& grad_tensors(int unit) const { return grads_.at(unit); }

  const std::vector<Event>& events() const { return events_; }
  void clear_events() { events_.clear(); }
  int count(Call call, int unit) const;

  // ParamContext. release() of a unit that is not gathered fails.
  const UnitTensors& gather(int unit) override;
  void release(int unit) override;
  const UnitTensors& grads(int unit) override;
  void grads_ready(int unit) override;
  Device device() const override { return Device::cpu; }
  DType compute_dtype() const override { return dtype_; }

 private:
  int checked(int unit) const;

  DType dtype_;
  std::vector<UnitTensors> params_;
  std::vector<UnitTensors> grads_;
  std::vector<int> gathered_;  // outstanding gathers per unit
  std::vector<Event> events_;
};

// A host f32 or f64 tensor's elements as doubles, and back (rounded for f32).
std::vector<double> to_doubles(const Tensor& t);
void assign_doubles(const Tensor& t, const std::vector<double>& values);

}  // namespace zshard::test
