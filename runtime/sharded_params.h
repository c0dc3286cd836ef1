// ShardedParams: the runtime side of the model API. It owns every unit's parameters, gradients and
// AdamW state as the strategy prescribes, and implements gather / release / grads / grads_ready:
//
//   gather(u)       sharded params: all-gather the unit into a transient buffer (waiting on a prefetch
//                   when one is in flight) and start the next unit's gather, in the order recorded on
//                   the first micro-step; resident params: hand out views.
//   release(u)      sharded params: free the gathered buffer (kept until backward when
//                   reshard_after_forward is off).
//   grads(u)        the full-size gradient buffer the model accumulates into: resident (ddp, zero1) or
//                   transient (zero2/3, hybrid).
//   grads_ready(u)  starts the unit's reduction at once, so it overlaps the rest of backward:
//                   reduce-scatter in the shard group, then all-reduce across replicas, then the result
//                   lands in the owned gradient shard. ddp and zero1 skip it until the last micro-step of
//                   an accumulation (no_sync); zero2/3 and hybrid reduce every micro-step so that no full
//                   gradient outlives its unit's backward.
#pragma once
#include <deque>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "kernels/cpu/ops.h"
#include "models/model.h"
#include "runtime/strategy.h"
#include "shard/flat_unit.h"

namespace zshard {

class ShardedParams : public ParamContext {
 public:
  // Collective over `world`. Parameters start from model.init_unit(seed).
  ShardedParams(const Model& model, comm::Communicator& world, const StrategyOptions& options, uint64_t seed);
  ~ShardedParams() override;

  // ParamContext
  const UnitTensors& gather(int unit) override;
  void release(int unit) override;
  const UnitTensors& grads(int unit) override;
  void grads_ready(int unit) override;
  Device device() const override { return Device::cpu; }
  DType compute_dtype() const override { return DType::f32; }

  // Step protocol, driven by the trainer.
  void begin_micro_step(bool sync_grads);  // sync_grads false = accumulate locally (ddp/zero1 no_sync)
  void end_micro_step();                   // waits for every reduction still in flight
  double grad_norm();                      // global L2 norm of the reduced gradient (one all-reduce)
  void optimizer_step(const cpu::AdamWParams& hp);  // AdamW on owned shards, re-gather, zero grads

  // Layout and owned state, for checkpoints, exports and reports.
  int num_units() const { return int(units_.size()); }
  const FlatLayout& layout(int unit) const;
  int shard_index() const { return shard_index_; }
  int shard_group_size() const { return shard_group_size_; }
  const StrategyOptions& options() const { return options_; }
  comm::Communicator& world() const { return world_; }
  // The owned shard (shard_numel elements) of the master params, Adam m and Adam v.
  Tensor owned_params(int unit) const;
  Tensor owned_grads(int unit) const;
  Tensor adam_m(int unit) const;
  Tensor adam_v(int unit) const;
  // After writing owned shards directly (loading), makes resident full copies consistent.
  void sync_resident_params();
  // Sets a unit's parameters from a full flat host buffer (padded_numel floats), every rank the same.
  void set_unit_params(int unit, const float* full);
  // Full flat parameters of a unit (padded_numel), all-gathered when sharded. Collective.
  std::vector<float> full_unit_params(int unit);
  // Bytes moved by this rank's communicators since the last reset.
  comm::CommStats comm_stats() const;
  void reset_comm_stats();

 private:
  struct Unit;
  struct Reduction {
    int unit;
    bool reduce_scattered;  // stage: reduce-scatter done, all-reduce (if any) next
    comm::WorkPtr work;
    Tensor scratch;
  };

  void start_gather(Unit& u);
  void finish_gather(Unit& u);
  void prefetch_after(size_t position);
  void free_gathered(Unit& u);
  bool advance(Reduction& r, bool blocking);
  void poll_reductions();
  int inflight_units() const;

  comm::Communicator& world_;
  StrategyOptions options_;
  StrategyGroups groups_;
  int shard_group_size_;
  int shard_index_;
  bool params_sharded_;
  bool grads_sharded_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::deque<Reduction> reductions_;

  bool sync_grads_ = true;
  bool in_backward_ = false;
  // Gather order recorded on the first micro-step; later micro-steps prefetch along it.
  std::vector<int> gather_order_;
  bool order_recorded_ = false;
  size_t gather_position_ = 0;
};

}  // namespace zshard
