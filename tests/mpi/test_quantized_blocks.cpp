// Quantized gathers and reductions keep a parameter of small values on its own scale: a unit of 300
// weights of about 1 and then 212 of about 1e-3 puts both into one chunk, starting 44 elements into it,
// so blocks counted from the chunk's start would round the small ones on the large ones' scale (to 0).
// Cut at the parameter boundary, each small element comes back within half its own parameter's scale:
// gathered, within absmax / 254; reduced, within the sum over the ranks of their absmax / (2 qmax). The
// tables of those blocks are counted where the estimator says.
// zshard-test-np: 2 4
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/allocator.h"
#include "shard/chunk_blocks.h"
#include "shard/memory/estimator.h"
#include "shard/reduction_quantization.h"
#include "shard/sharded_params.h"
#include "tests/support/test_support.h"

namespace zshard {
namespace {

constexpr int64_t kLarge = 300, kSmall = 212;

float large_value(int64_t j, int rank) { return float((rank + 1) * std::sin(0.7 * double(j) + 0.3)); }
float small_value(int64_t j, int rank) { return float(1e-3 * (rank + 1) * std::sin(1.3 * double(j) + 0.1)); }

// One unit: the large parameter, then the small one, initialised to large_value and small_value of rank 0.
class TwoScales final : public Model {
 public:
  std::vector<UnitSpec> units() const override {
    return {{"mixed", {{"large", {kLarge}, true}, {"small", {kSmall}, false}}}};
  }
  void init_unit(int, const UnitTensors& params, uint64_t) const override {
    for (int64_t j = 0; j < kLarge; ++j) params[0].data<float>()[j] = large_value(j, 0);
    for (int64_t j = 0; j < kSmall; ++j) params[1].data<float>()[j] = small_value(j, 0);
  }
  double forward_backward(ParamContext&, const Batch&, float) override { return 0; }
  double forward(ParamContext&, const Batch&) override { return 0; }
  int64_t activation_bytes(int, int, DType) const override { return 0; }
  int vocab_size() const override { return 16; }
  int context_length() const override { return 16; }
};

// The small parameter begins inside a chunk, off the block grid of that chunk's start: blocks of 64 or
// 256 counted from there would hold elements of both parameters.
void expect_a_chunk_mixes_the_parameters(const FlatLayout& layout) {
  const int64_t begin = layout.offset(1), chunk_start = begin / layout.shard_numel() * layout.shard_numel();
  ASSERT_GT(begin, chunk_start);
  ASSERT_NE((begin - chunk_start) % 64, 0);
}

TEST(QuantizedBlocks, ASmallParameterIsGatheredOnItsOwnScale) {
  StrategyOptions s{StrategyKind::zero3};
  s.quantize_gathers = GatherQuantization::int8;
  const TwoScales model;
  ShardedParams params(model, test::world(), test::plan(s), 1);
  expect_a_chunk_mixes_the_parameters(params.layout(0));
  params.begin_forward_only();
  const float* small = params.gather(0)[1].data<float>();
  float absmax = 0;
  for (int64_t j = 0; j < kSmall; ++j) absmax = std::max(absmax, std::fabs(small_value(j, 0)));
  const double bound = absmax / 127.0 * (0.5 + 0x1p-16);
  double worst = 0;
  for (int64_t j = 0; j < kSmall; ++j) worst = std::max(worst, std::abs(double(small[j]) - small_value(j, 0)));
  EXPECT_LE(worst, bound) << "the small parameter was rounded on another scale than its own";
  EXPECT_GT(worst, 0.0) << "nothing was quantized";
  params.release(0);
  params.end_micro_step();
}

TEST(QuantizedBlocks, ASmallParametersGradientIsReducedOnItsOwnScale) {
  const int ranks = test::world().size(), me = test::world().rank();
  for (ReductionQuantization q : {ReductionQuantization::int8, ReductionQuantization::int4}) {
    for (StrategyKind kind : {StrategyKind::zero2, StrategyKind::zero3}) {
      StrategyOptions s{kind};
      s.quantize_reductions = q;
      const std::string what = std::string(strategy_name(kind)) + " " + std::string(reduction_quantization_name(q));
      const TwoScales model;
      ShardedParams params(model, test::world(), test::plan(s), 1);
      const FlatLayout& layout = params.layout(0);
      expect_a_chunk_mixes_the_parameters(layout);
      params.begin_micro_step(true);
      const UnitTensors& grads = params.grads(0);
      for (int64_t j = 0; j < kLarge; ++j) grads[0].data<float>()[j] = large_value(j, me);
      for (int64_t j = 0; j < kSmall; ++j) grads[1].data<float>()[j] = small_value(j, me);
      params.grads_ready(0);
      params.end_micro_step();

      // Each rank's small gradient is off by at most half its own block's scale, at most absmax / qmax.
      const double qmax = reduction_quant_format(q).bits == 8 ? 127 : 7;
      double bound = 0;
      for (int r = 0; r < ranks; ++r) {
        float absmax = 0;
        for (int64_t j = 0; j < kSmall; ++j) absmax = std::max(absmax, std::fabs(small_value(j, r)));
        bound += absmax / qmax * (0.5 + 0x1p-16);
      }
      const Tensor owned = params.owned_grads(0);
      const int64_t first = layout.shard_begin(params.shard_index());
      double worst = 0;
      for (int64_t i = std::max(first, kLarge); i < std::min(first + layout.shard_numel(), kLarge + kSmall); ++i) {
        double exact = 0;
        for (int r = 0; r < ranks; ++r) exact += small_value(i - kLarge, r);
        worst = std::max(worst, std::abs(double(owned.data<float>()[i - first]) - exact) - 1e-6 * std::abs(exact));
      }
      EXPECT_LE(worst, bound) << what << " on rank " << me << ": the small gradient was rounded on another scale";
    }
  }
}

// The block tables live on the run's device, each beside what it quantizes (the gathers' with the
// parameters and the frozen ones, the reductions' with the gradients), and the estimator counts them.
TEST(QuantizedBlocks, TheTablesAreCountedWithTheModelStatesTheyServe) {
  StrategyOptions s{StrategyKind::zero3};
  s.quantize_gathers = GatherQuantization::int8;
  s.quantize_reductions = ReductionQuantization::int4;
  const TwoScales model;
  const std::vector<std::string> freeze = {"small"};  // a frozen buffer too
  const auto live = [](Category c) { return Allocator::of(Device::cpu).stats().live[int(c)]; };
  const int64_t params_before = live(Category::params), frozen_before = live(Category::frozen),
                grads_before = live(Category::grads);
  const ShardedParams params(model, test::world(), test::plan(s), 1, freeze);
  EstimateInput in;
  in.model = &model;
  in.plan = params.plan();
  in.freeze = freeze;
  in.group = 0;
  const ModelStateBytes want = estimate_memory(in).model_states;
  EXPECT_EQ(live(Category::params) - params_before, want.params);
  EXPECT_EQ(live(Category::frozen) - frozen_before, want.frozen);
  EXPECT_EQ(live(Category::grads) - grads_before, want.grads);
}

}  // namespace
}  // namespace zshard
