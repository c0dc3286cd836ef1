// Quantized parameter gathers (--quantize-gathers int8, ZeRO++'s qwZ) under zero3 and hybrid: what a
// gather hands the model is, bit for bit, each shard quantized and dequantized by the host's reference
// kernels, trainable and frozen parameters alike, at set-up and after AdamW's steps, in fp32 and bf16;
// training stays within the quantization error's first-order effect of the unquantized run and repeats
// itself exactly; the strategies that gather no parameters refuse it.
// zshard-test-np: 2 4
#include <gtest/gtest.h>

#include <bit>
#include <cmath>

#include <zshard/error.h>

#include "kernels/cpu/ops.h"
#include "shard/chunk_blocks.h"
#include "shard/engine_internals.h"
#include "shard/frozen_params.h"
#include "shard/gather_quantization.h"
#include "tests/support/test_support.h"
#include "tests/support/training_runs.h"

namespace zshard {
namespace {

const std::vector<std::string> kFrozen = {"wpe.weight", "h.0.mlp.*"};  // a unit of each kind: none, some, all

StrategyOptions quantized(StrategyKind kind) {
  const int n = test::world().size();
  StrategyOptions s{kind, kind == StrategyKind::hybrid ? ShardGroupRequest::equal(n / 2) : ShardGroupRequest()};
  s.quantize_gathers = GatherQuantization::int8;
  return s;
}

// zero3, and hybrid where its groups are of two or more (np 4): a group of one has nothing to gather and
// refuses the quantization.
std::vector<StrategyOptions> quantized_strategies() {
  std::vector<StrategyOptions> out{quantized(StrategyKind::zero3)};
  if (test::world().size() >= 4) out.push_back(quantized(StrategyKind::hybrid));
  return out;
}

TrainOptions options(const StrategyOptions& strategy, DType param_dtype, int steps) {
  TrainOptions o = test::tiny_options(steps);
  o.plan.strategy = strategy;
  o.plan.placement.param_dtype = param_dtype;
  o.model.freeze = kFrozen;
  return o;
}

// A flat buffer's values as a gather of it must deliver them: each shard of `layout` in the compute dtype,
// quantized and dequantized on the host.
template <class T>
std::vector<float> host_dequantized(const FlatValues& flat, const FlatLayout& layout) {
  const size_t shard = size_t(layout.shard_numel());
  std::vector<float> out;
  for (int r = 0; r < layout.group_size(); ++r) {
    const ops::HostBlockTable blocks = chunk_blocks(layout, r, kGatherQuantFormat);
    std::vector<T> x(shard), back(shard);
    for (size_t i = 0; i < shard; ++i) x[i] = T(flat[size_t(layout.shard_begin(r)) + i]);
    std::vector<int8_t> payload(ops::quantized_size(shard, kGatherQuantFormat.bits, blocks.blocks()).payload_bytes);
    std::vector<float> scales(blocks.blocks());
    cpu::quantize_blocks(payload.data(), scales.data(), x.data(), shard, kGatherQuantFormat, blocks.host_table());
    cpu::dequantize_blocks(back.data(), payload.data(), scales.data(), shard, kGatherQuantFormat, blocks.host_table(),
                           false);
    for (const T& v : back) out.push_back(float(v));
  }
  return out;
}

// A unit's two flat buffers in fp32, as the fp32 master and the frozen compute copy hold them. Collective.
struct UnitFlats {
  FlatValues trainable, frozen;
};
UnitFlats unit_flats(ShardedParams& params, const UnitSpec& unit, int u) {
  UnitFlats flats{params.full_unit_params(u), FlatValues(size_t(params.frozen_layout(u).padded_numel()))};
  const FlatValues every = params.whole_unit_params(u);
  const FlatLayout whole(unit, 1);
  const UnitSplit split = split_unit(unit);
  for (size_t p = 0; p < split.slots.size(); ++p)
    if (split.slots[p].frozen)
      std::copy_n(every.begin() + whole.offset(int(p)), unit.params[p].numel(),
                  flats.frozen.begin() + params.frozen_layout(u).offset(split.slots[p].index));
  return flats;
}

// Elements of the gathered views of every unit that differ from the host's dequantized shards. Collective.
template <class T>
int64_t gathered_mismatches(ShardedParams& params, const Model& model) {
  const std::vector<UnitSpec> units = freeze_matching(model.units(), kFrozen);
  int64_t wrong = 0;
  params.begin_forward_only();
  for (int u = 0; u < params.num_units(); ++u) {
    const FlatLayout& trainable = params.layout(u);
    const FlatLayout& frozen = params.frozen_layout(u);
    const UnitFlats flats = unit_flats(params, units[size_t(u)], u);
    const std::vector<float> want_trainable = host_dequantized<T>(flats.trainable, trainable);
    const std::vector<float> want_frozen = host_dequantized<T>(flats.frozen, frozen);
    const UnitSplit split = split_unit(units[size_t(u)]);
    const UnitTensors& views = params.gather(u);
    for (size_t p = 0; p < split.slots.size(); ++p) {
      const ParamSlot& slot = split.slots[p];
      const float* want = (slot.frozen ? want_frozen : want_trainable).data() +
                          (slot.frozen ? frozen : trainable).offset(slot.index);
      const T* got = views[p].data<T>();
      for (int64_t j = 0; j < views[p].numel(); ++j)
        wrong += std::bit_cast<uint32_t>(float(got[j])) != std::bit_cast<uint32_t>(want[j]);
    }
    params.release(u);
  }
  params.end_micro_step();
  return wrong;
}

TEST(QuantizedGathers, GatheredParamsAreTheHostsDequantizedShards) {
  for (const StrategyOptions& s : quantized_strategies()) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      const std::string what = test::describe(s) + " " + std::string(dtype_name(dtype));
      Trainer trainer(options(s, dtype, 2), test::world());
      ShardedParams& params = EngineInternals::params(trainer.engine());
      const auto mismatches = [&] {
        return dtype == DType::f32 ? gathered_mismatches<float>(params, trainer.model())
                                   : gathered_mismatches<bf16>(params, trainer.model());
      };
      EXPECT_EQ(mismatches(), 0) << what << ", at set-up";
      trainer.run(nullptr);  // AdamW changed every trainable shard: each owner quantized it again
      EXPECT_EQ(mismatches(), 0) << what << ", after two steps";
    }
  }
}

// The sum of squares of what quantizing `flat`'s shards changes: ||delta||^2 of the weights the model sees.
double squared_quantization_error(const FlatValues& flat, const FlatLayout& layout) {
  const std::vector<float> back = host_dequantized<float>(flat, layout);
  double sum = 0;
  for (size_t i = 0; i < back.size(); ++i) sum += std::pow(double(back[i]) - double(flat[i]), 2);
  return sum;
}

// The bound at step k: 2 (k + 1) ||g_k|| ||delta||. To first order a loss moves by at most ||g|| ||delta||
// when the weights move by delta (Cauchy-Schwarz), with g the step's gradient (the unquantized run's, its
// norm before clipping) and delta the initial weights' quantization error, computed on the host from
// the shards (about 0.06 here, against a gradient norm of 2 to 3). Doubled for the second-order terms,
// and multiplied by the steps taken, over which the two runs' weights also drift apart through their
// updates. A worst case (the errors would have to line up with the gradient), it catches gathers that
// hand out wrong weights, not rounding that is a little off: the test above pins those bits. The quantized
// run must differ from the other at all: the gathers were quantized.
TEST(QuantizedGathers, LossesStayWithinTheQuantizationErrorsFirstOrderEffect) {
  constexpr int kSteps = 3;
  for (const StrategyOptions& s : quantized_strategies()) {
    const TrainOptions o = options(s, DType::f32, kSteps);
    TrainOptions exact = o;
    exact.plan.strategy.quantize_gathers = GatherQuantization::none;
    double delta_squared = 0;
    {
      Trainer trainer(exact, test::world());
      ShardedParams& params = EngineInternals::params(trainer.engine());
      const std::vector<UnitSpec> units = freeze_matching(trainer.model().units(), kFrozen);
      for (int u = 0; u < params.num_units(); ++u) {
        const UnitFlats flats = unit_flats(params, units[size_t(u)], u);
        delta_squared += squared_quantization_error(flats.trainable, params.layout(u)) +
                         squared_quantization_error(flats.frozen, params.frozen_layout(u));
      }
    }
    const test::RunResult q = test::train(o, test::world()), reference = test::train(exact, test::world());
    ASSERT_EQ(q.losses.size(), size_t(kSteps));
    for (int k = 0; k < kSteps; ++k) {
      const double bound = 2.0 * (k + 1) * reference.grad_norms[size_t(k)] * std::sqrt(delta_squared);
      EXPECT_LE(std::abs(q.losses[size_t(k)] - reference.losses[size_t(k)]), bound)
          << test::describe(s) << " step " << k << ": " << q.losses[size_t(k)] << " vs " << reference.losses[size_t(k)];
    }
    EXPECT_NE(q.losses[0], reference.losses[0]) << test::describe(s) << ": the gathers were not quantized";
  }
}

TEST(QuantizedGathers, RunsRepeatBitForBit) {
  for (const StrategyOptions& s : quantized_strategies()) {
    const TrainOptions o = options(s, DType::bf16, 2);
    const test::RunResult a = test::train(o, test::world()), b = test::train(o, test::world());
    EXPECT_EQ(a.losses, b.losses) << test::describe(s);
    EXPECT_EQ(a.params, b.params) << test::describe(s);
  }
}

TEST(QuantizedGathers, RefusedWhereNoParametersAreGatheredAndForOtherFormats) {
  for (StrategyKind k : {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2}) {
    PlanOptions o;
    o.strategy = quantized(k);
    o.strategy.shard_group = {};
    EXPECT_EQ(test::error_of([&] { validate_plan_options(o); }),
              "--quantize-gathers is only for --strategy zero3 or hybrid")
        << strategy_name(k);
  }
  EXPECT_EQ(test::error_of([] { parse_gather_quantization("int4"); }),
            "--quantize-gathers int4: 4-bit parameter gathers are not supported (valid: none, int8)");
  EXPECT_EQ(test::error_of([] { parse_gather_quantization("fp8"); }),
            "--quantize-gathers: unknown value 'fp8' (valid: none, int8)");
}

}  // namespace
}  // namespace zshard
