#include "runtime/planning/tune_cost.h"

#include <algorithm>
#include <cmath>

#include <zshard/error.h>

#include "runtime/planning/rank_balancer.h"
#include "runtime/planning/scaling_projection.h"
#include "shard/comm_volume.h"
#include "shard/frozen_params.h"

namespace zshard {

namespace {

// Nominal rates: they only order the candidates until one of them has run. A core of a current CPU
// sustains some 20 GFLOP/s of fp32 GEMM and steps AdamW over a parameter in about 2 ns (28 bytes read
// and written at ~15 GB/s); ranks on one host exchange a few GB/s through shared memory. A GPU: some
// 200 TFLOP/s, its link the NVLink profile, AdamW at HBM speed.
constexpr double kCpuFlopsPerS = 2e10, kGpuFlopsPerS = 2e14;
constexpr double kCpuBytesPerMs = 2e6, kCpuMsPerCall = 0.05, kGpuMsPerCall = 0.02;
constexpr double kCpuOptimizerMsPerParam = 2e-6, kGpuOptimizerMsPerParam = 1e-8;
constexpr double kNominalExposedFraction = 0.5;

// The smallest shard group's size: its ranks hold the largest shards, and the step waits for them.
int smallest_group_size(const ShardGroups& g) { return *std::min_element(g.sizes().begin(), g.sizes().end()); }

// The model's parameters split as the run would freeze them (ParamSpec::frozen, --freeze): a frozen one is
// gathered like any other, but has no gradient to reduce, no update to re-gather and no AdamW.
ParamCounts problem_params(const TuneProblem& p) { return count_params(*p.model, p.freeze); }

// Bytes and collective calls per step of a rank, and of those the gathers nothing prefetches (--max-inflight 1).
struct CommLoad {
  double bytes = 0, calls = 0;
  double unprefetched_bytes = 0, unprefetched_calls = 0;
};

CommLoad comm_load(const TuneProblem& p, const Candidate& c) {
  const ShardPlan plan = candidate_plan(p, c);
  const ShardGroups& groups = plan.groups;
  const int K = c.grad_accum;
  const ParamCounts params = problem_params(p);
  const double U = double(p.model->units().size());  // one collective per unit and pass
  // GPT-2 gathers every unit for forward and again for backward; kept from forward, once. With secondary
  // groups backward's gathers run inside them, and the largest group's ranks move the most.
  const int gathers = c.reshard_after_forward ? 2 : 1;
  int secondary_group = 1;
  if (plan.secondary_groups)
    for (int h : plan.secondary_groups->sizes()) secondary_group = std::max(secondary_group, h);
  const DtypePolicy dtypes = DtypePolicy::of(p.param_dtype, c.quantize_gathers, c.quantize_reductions);
  const CommVolume volume = comm_volume({.kind = c.kind,
                                         .world = groups.world_size(),
                                         .group = smallest_group_size(groups),
                                         .replicas = groups.count(),
                                         .psi = params.trainable,
                                         .gathered = gathers * params.total(),
                                         .grad_accum = K,
                                         .param_bytes = dtypes.param_bytes,
                                         .grad_bytes = int(dtype_size(plan.placement.reduce_dtype)),
                                         .quantized_gathers = dtypes.quantized_gathers,
                                         .quantized_reductions = dtypes.quantized_reductions,
                                         .secondary_gathered = plan.secondary_groups ? params.total() : 0,
                                         .secondary_group = secondary_group});
  CommLoad v;
  v.bytes = volume.total();
  switch (plan.runs_as_ddp() ? StrategyKind::ddp : c.kind) {
    case StrategyKind::ddp: v.calls = U; break;                // all-reduce, once per step (no_sync)
    case StrategyKind::zero1: v.calls = 2 * U; break;          // reduce-scatter once, all-gather after the step
    case StrategyKind::zero2: v.calls = (K + 1) * U; break;    // reduce-scatter every micro-step
    case StrategyKind::zero3: v.calls = K * (gathers + 1) * U; break;
    case StrategyKind::hybrid: v.calls = K * (gathers + 2) * U; break;  // and an all-reduce across groups
  }
  if (plan.params_sharded() && c.max_inflight == 1) {
    v.unprefetched_bytes = volume.gather + volume.secondary;
    v.unprefetched_calls = double(K) * gathers * U;
  }
  return v;
}

// Every strategy but ddp (whose groups are single ranks) shards the optimizer over its shard group.
double owned_params(const TuneProblem& p, const Candidate& c) {
  return std::ceil(double(problem_params(p).trainable) / smallest_group_size(candidate_plan(p, c).groups));
}

double compute_ms(const TuneProblem& p, const Candidate& c, const std::vector<double>& seconds_per_seq) {
  const std::vector<int> split = predicted_split(c, p.world, seconds_per_seq);
  double slowest = 0;
  for (int r = 0; r < p.world; ++r) slowest = std::max(slowest, split[size_t(r)] * seconds_per_seq[size_t(r)]);
  const double factor = c.checkpointing == Recompute::blocks ? recompute_factor(*p.model, p.seq) : 1;
  return 1e3 * slowest * c.grad_accum * factor;
}

double comm_ms(double bytes, double calls, const Calibration& rates) {
  return calls * rates.comm_ms_per_call + bytes / rates.comm_bytes_per_ms;
}

double exposed_comm_ms(const CommLoad& v, const Calibration& rates) {
  const double e = rates.exposed_fraction;  // so written that e = 1 gives the total exactly, as prefetching does
  return e * comm_ms(v.bytes, v.calls, rates) + (1 - e) * comm_ms(v.unprefetched_bytes, v.unprefetched_calls, rates);
}

}  // namespace

double recompute_factor(const Model& model, int seq) {
  const std::vector<UnitSpec> units = model.units();
  double blocks = 0;  // parameters of the units between the first and the last
  for (size_t u = 1; u + 1 < units.size(); ++u) blocks += double(units[u].numel());
  const double step = model.flops_per_token(seq);  // forward and backward
  // What grows with the sequence, attention's scores and weighted values, all of it in the blocks (frozen
  // parameters count 4 FLOPs, not 6: the count at seq 0 is the parameters' own).
  const double attention = std::max(0.0, step - model.flops_per_token(0));
  return 1 + (2 * blocks + attention / 3) / step;
}

std::vector<int> predicted_split(const Candidate& c, int world, const std::vector<double>& seconds_per_seq) {
  if (!c.auto_split) return std::vector<int>(size_t(world), c.batch / world);
  std::vector<double> speed;
  for (double s : seconds_per_seq) speed.push_back(1 / s);
  return proportional_split(c.batch, speed, std::vector<int>(size_t(world), c.max_rank_batch));
}

bool unequal_speeds(const Calibration& rates) {
  const auto [lo, hi] = std::minmax_element(rates.seconds_per_seq.begin(), rates.seconds_per_seq.end());
  return *hi > 1.2 * *lo;
}

Calibration nominal_calibration(const TuneProblem& p) {
  const bool cpu = p.device == Device::cpu;
  Calibration rates;
  const double seq_flops = p.model->flops_per_token(p.seq) * p.seq;
  rates.seconds_per_seq.assign(size_t(p.world), seq_flops / (cpu ? kCpuFlopsPerS : kGpuFlopsPerS));
  rates.comm_bytes_per_ms = cpu ? kCpuBytesPerMs : link_profile("nvlink").bandwidth_gbs * 1e6;
  rates.comm_ms_per_call = cpu ? kCpuMsPerCall : kGpuMsPerCall;
  rates.exposed_fraction = kNominalExposedFraction;
  rates.optimizer_ms_per_param = cpu ? kCpuOptimizerMsPerParam : kGpuOptimizerMsPerParam;
  return rates;
}

Calibration calibrate(const TuneProblem& p, const Candidate& ran, const MeasuredRun& m) {
  if (int(m.seq_per_s.size()) != p.world)
    fail("calibration: the run measured ", m.seq_per_s.size(), " ranks' speeds, the world has ", p.world);
  Calibration rates = nominal_calibration(p);
  rates.measured = true;
  const double factor = ran.checkpointing == Recompute::blocks ? recompute_factor(*p.model, p.seq) : 1;
  for (int r = 0; r < p.world; ++r) {
    const double v = m.seq_per_s[size_t(r)];
    if (!(v > 0 && std::isfinite(v))) fail("calibration: rank ", r, " measured no speed (", v, " sequences/s)");
    rates.seconds_per_seq[size_t(r)] = 1 / v / factor;
  }
  // The replay of the run's collectives at one element each is their latency; the rest is their bytes.
  const CommLoad load = comm_load(p, ran);
  if (m.comm_latency_ms > 0 && load.calls > 0) rates.comm_ms_per_call = m.comm_latency_ms / load.calls;
  if (m.comm_total_ms > m.comm_latency_ms && load.bytes > 0)
    rates.comm_bytes_per_ms = load.bytes / (m.comm_total_ms - m.comm_latency_ms);
  const double total_ms = comm_ms(load.bytes, load.calls, rates);
  const double unprefetched_ms = comm_ms(load.unprefetched_bytes, load.unprefetched_calls, rates);
  if (total_ms > unprefetched_ms)
    rates.exposed_fraction = std::clamp((m.comm_exposed_ms - unprefetched_ms) / (total_ms - unprefetched_ms), 0.0, 1.0);
  const double compute = compute_ms(p, ran, rates.seconds_per_seq);
  // The time a rank blocked in collectives holds its wait for the slowest rank, whose compute is counted
  // already: where the two exceed the step, the overlap is taken from the exposed share, so that the
  // calibrating run is predicted as it ran.
  if (const double room = m.step_ms - compute; room < exposed_comm_ms(load, rates) && total_ms > unprefetched_ms)
    rates.exposed_fraction = std::clamp((room - unprefetched_ms) / (total_ms - unprefetched_ms), 0.0, 1.0);
  const double rest = m.step_ms - compute - exposed_comm_ms(load, rates);
  rates.optimizer_ms_per_param = std::max(0.0, rest) / owned_params(p, ran);
  return rates;
}

StepCost predict_step(const TuneProblem& p, const Candidate& c, const Calibration& rates) {
  StepCost cost;
  cost.compute_ms = compute_ms(p, c, rates.seconds_per_seq);
  cost.comm_ms = exposed_comm_ms(comm_load(p, c), rates);
  cost.optimizer_ms = rates.optimizer_ms_per_param * owned_params(p, c);
  return cost;
}

}  // namespace zshard
