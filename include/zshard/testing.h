// zshard's public checking context for a model's tests. LocalParams: a single-process ParamContext that
// holds every unit's full parameters and gradients as separate tensors of one dtype on one device (the
// model computes there, in that dtype), records each protocol call so that tests can check how a model
// uses gather/release/grads/grads_ready, and refuses much of what the engine refuses: a release without a
// gather and a grads_ready without its grads() as they happen, a unit left open or never handed back at
// check_micro_step_closed(). (It cannot tell micro-steps apart without that call: a grads() after the
// unit's grads_ready() counts as the next micro-step's, where the engine refuses it within one.)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <zshard/model.h>

namespace zshard {

class LocalParams final : public ParamContext {
 public:
  enum class Call { gather, release, grads, grads_ready };
  struct Event {
    Call call;
    int unit;
  };

  // Parameters and gradients zero-filled in `dtype` on `device`: f32 or bf16, or f64 on cpu (the pairs
  // a model computes in; cuda needs cuda_init first). A frozen parameter (ParamSpec::frozen, or matched by
  // a pattern of `freeze`, as EngineOptions::freeze's) has no gradient: its grads() entry is an undefined
  // Tensor. A pattern that matches nothing is refused, as the engine refuses it.
  LocalParams(const Model& model, DType dtype, Device device = Device::cpu, const std::vector<std::string>& freeze = {});

  // Fills every unit with model.init_unit(u, ..., seed). Host contexts only (init_unit fills host
  // tensors); a device context takes an initialised host one's values with copy_params_from.
  void init(const Model& model, uint64_t seed);
  // Copies another context's parameters, converting the dtype and moving them between devices.
  void copy_params_from(const LocalParams& other);
  void zero_grads();

  // Direct access for tests; not protocol calls.
  int num_units() const { return int(params_.size()); }
  const UnitTensors& param_tensors(int unit) const { return params_.at(unit); }
  const UnitTensors& grad_tensors(int unit) const { return grads_.at(unit); }  // undefined where frozen

  const std::vector<Event>& events() const { return events_; }
  void clear_events() { events_.clear(); }
  int count(Call call, int unit) const;

  // What the engine checks at the end of every micro-step, to call after a forward_backward (`backward`
  // true) or a forward: no unit still gathered, no grads() without its grads_ready(), and after a backward
  // every unit with trainable parameters made ready (a unit a backward never hands back would not train).
  // Throws Error naming the unit. Either way the next micro-step starts with nothing held.
  void check_micro_step_closed(bool backward);

  // ParamContext. release() of a unit that is not gathered fails; so do grads_ready() twice, or without
  // grads() since the unit's last grads_ready().
  const UnitTensors& gather(int unit) override;
  void release(int unit) override;
  const UnitTensors& grads(int unit) override;
  void grads_ready(int unit) override;
  Device device() const override { return device_; }
  DType compute_dtype() const override { return dtype_; }

 private:
  int checked(int unit) const;

  DType dtype_;
  Device device_;
  std::vector<UnitTensors> params_;
  std::vector<UnitTensors> grads_;
  std::vector<int> gathered_;  // outstanding gathers per unit
  enum class Grads { untouched, requested, ready };
  std::vector<Grads> grads_state_;  // per unit, in the current micro-step
  std::vector<bool> trainable_;     // per unit: any parameter with a gradient
  std::vector<Event> events_;
};

// An f32, f64 or bf16 tensor's elements, on either device, as doubles; and back (rounded to f32, and
// then to bf16 for a bf16 tensor).
std::vector<double> to_doubles(const Tensor& t);
void assign_doubles(const Tensor& t, const std::vector<double>& values);

}  // namespace zshard
