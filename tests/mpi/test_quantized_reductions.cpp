// Quantized gradient reductions (--quantize-reductions int8|int4, ZeRO++'s qgZ) under zero1, zero2, zero3
// and hybrid: every unit's reduced shard is, bit for bit, the sum in fp32 of each group member's chunk
// quantized and dequantized by the host's reference kernels (hybrid: those sums added across the groups);
// it lies within the quantization's bound of the unquantized reduction; training with it repeats itself
// exactly; ddp and unknown formats are refused.
// zshard-test-np: 2 4
#include <gtest/gtest.h>

#include <bit>
#include <cmath>

#include <zshard/error.h>

#include "kernels/cpu/ops.h"
#include "kernels/quantize_blocks.h"
#include "models/gpt2.h"
#include "shard/chunk_blocks.h"
#include "shard/reduction_quantization.h"
#include "shard/sharded_params.h"
#include "tests/support/test_support.h"
#include "tests/support/training_runs.h"

namespace zshard {
namespace {

StrategyOptions quantized(StrategyKind kind, ReductionQuantization q) {
  const int n = test::world().size();
  StrategyOptions s{kind, kind == StrategyKind::hybrid ? ShardGroupRequest::equal(n / 2) : ShardGroupRequest()};
  s.quantize_reductions = q;
  return s;
}

// Every strategy that reduces with quantized chunks, in both formats; hybrid where it has two groups.
std::vector<StrategyOptions> cases() {
  std::vector<StrategyOptions> out;
  for (ReductionQuantization q : {ReductionQuantization::int8, ReductionQuantization::int4}) {
    for (StrategyKind k : {StrategyKind::zero1, StrategyKind::zero2, StrategyKind::zero3}) out.push_back(quantized(k, q));
    if (test::world().size() >= 4) out.push_back(quantized(StrategyKind::hybrid, q));
  }
  return out;
}

// The gradient world rank `rank` writes into element i of unit u's flat buffer: magnitudes that change
// from block to block and from rank to rank, so that every chunk has scales of its own.
float gradient(int rank, int u, int64_t i) {
  const double magnitude = 1e-2 * (1 + (i / 256) % 5) * (rank + 1);
  return float(magnitude * std::sin(0.37 * double(i) + 1.3 * rank + u));
}

// Unit u's full flat gradient on world rank `rank` (padding zero).
std::vector<float> full_gradient(const FlatLayout& layout, int rank, int u) {
  std::vector<float> g(size_t(layout.padded_numel()), 0.f);
  for (int p = 0; p < int(layout.spec().params.size()); ++p)
    for (int64_t j = 0; j < layout.spec().params[size_t(p)].numel(); ++j)
      g[size_t(layout.offset(p) + j)] = gradient(rank, u, layout.offset(p) + j);
  return g;
}

// One micro-step in which every rank hands gradient(rank, ...) for every unit; the owned gradient shards.
std::vector<std::vector<float>> reduced_shards(const StrategyOptions& s) {
  ShardedParams p(test::tiny_gpt2(), test::world(), test::plan(s), 1);
  p.begin_micro_step(true);
  for (int u = p.num_units() - 1; u >= 0; --u) {
    const UnitTensors& views = p.grads(u);
    for (size_t v = 0; v < views.size(); ++v) {
      const int64_t offset = p.layout(u).offset(int(v));
      for (int64_t j = 0; j < views[v].numel(); ++j) views[v].data<float>()[j] = gradient(test::world().rank(), u, offset + j);
    }
    p.grads_ready(u);
  }
  p.end_micro_step();
  std::vector<std::vector<float>> shards;
  for (int u = 0; u < p.num_units(); ++u) {
    const Tensor owned = p.owned_grads(u);
    shards.emplace_back(owned.data<float>(), owned.data<float>() + owned.numel());
  }
  return shards;
}

// What the owner of shard `owner` of a group of `layout.group_size()` ranks starting at `first` sums: each
// member's chunk quantized and dequantized on the host, added in fp32 in rank order. `bound` gets, per
// element, the sum over the members of half their block's scale.
std::vector<float> host_group_sum(const FlatLayout& layout, int u, int first, int owner, ReductionQuantization q,
                                  std::vector<double>& bound) {
  const ops::QuantFormat format = reduction_quant_format(q);
  const size_t shard = size_t(layout.shard_numel());
  const ops::HostBlockTable blocks = chunk_blocks(layout, owner, format);
  std::vector<float> sum(shard, 0.f);
  for (int member = 0; member < layout.group_size(); ++member) {
    const std::vector<float> full = full_gradient(layout, first + member, u);
    const float* chunk = full.data() + layout.shard_begin(owner);
    std::vector<int8_t> payload(ops::quantized_size(shard, format.bits, blocks.blocks()).payload_bytes);
    std::vector<float> scales(blocks.blocks());
    cpu::quantize_blocks(payload.data(), scales.data(), chunk, shard, format, blocks.host_table());
    cpu::dequantize_blocks(sum.data(), payload.data(), scales.data(), shard, format, blocks.host_table(), member > 0);
    for (size_t i = 0; i < shard; ++i) bound[i] += 0.5 * double(scales[quant::block_of(blocks.host_table(), i)]);
  }
  return sum;
}

// The host's reduction of this rank's shard of every unit, and its error bound: its group's sum, plus,
// under hybrid, the other groups' sums of the same shard (two groups: one fp32 addition, in either order).
struct HostReduction {
  std::vector<std::vector<float>> shards;
  std::vector<std::vector<double>> bounds;
};
HostReduction host_reduction(const StrategyOptions& s) {
  const ShardPlan plan = test::plan(s);
  const int me = test::world().rank(), group = plan.groups.group_of(me);
  const int owner = me - plan.groups.first_rank(group);
  HostReduction out;
  const std::vector<UnitSpec> units = test::tiny_gpt2().units();
  for (int u = 0; u < int(units.size()); ++u) {
    const FlatLayout layout(units[size_t(u)], plan.groups.size(group), plan.groups.pad_multiple());
    std::vector<double> bound(size_t(layout.shard_numel()), 0.0);
    std::vector<float> total;
    for (int g = 0; g < plan.groups.count(); ++g) {
      const std::vector<float> sum = host_group_sum(layout, u, plan.groups.first_rank(g), owner, s.quantize_reductions, bound);
      if (total.empty()) total = sum;
      else for (size_t i = 0; i < sum.size(); ++i) total[i] += sum[i];
    }
    out.shards.push_back(std::move(total));
    out.bounds.push_back(std::move(bound));
  }
  return out;
}

TEST(QuantizedReductions, ReducedShardsAreTheHostsSumsOfDequantizedChunks) {
  for (const StrategyOptions& s : cases()) {
    const std::vector<std::vector<float>> got = reduced_shards(s);
    const HostReduction want = host_reduction(s);
    ASSERT_EQ(got.size(), want.shards.size()) << test::describe(s);
    int64_t wrong = 0;
    for (size_t u = 0; u < got.size(); ++u) {
      ASSERT_EQ(got[u].size(), want.shards[u].size()) << test::describe(s) << " unit " << u;
      for (size_t i = 0; i < got[u].size(); ++i)
        wrong += std::bit_cast<uint32_t>(got[u][i]) != std::bit_cast<uint32_t>(want.shards[u][i]);
    }
    EXPECT_EQ(wrong, 0) << test::describe(s) << " on rank " << test::world().rank();
  }
}

// Against the unquantized reduction of the same gradients: per element, within the sum over the ranks of
// half their block's scale, plus the fp32 rounding of the sums (a few ulps of the sum of magnitudes,
// far below the scales here). And not equal to it: the reductions were quantized.
TEST(QuantizedReductions, StayWithinTheBlockErrorBoundOfTheUnquantizedReduction) {
  for (const StrategyOptions& s : cases()) {
    StrategyOptions exact_strategy = s;
    exact_strategy.quantize_reductions = ReductionQuantization::none;
    const std::vector<std::vector<float>> got = reduced_shards(s), exact = reduced_shards(exact_strategy);
    const HostReduction host = host_reduction(s);
    double worst = 0, largest_error = 0;
    for (size_t u = 0; u < got.size(); ++u) {
      for (size_t i = 0; i < got[u].size(); ++i) {
        const double error = std::abs(double(got[u][i]) - double(exact[u][i]));
        const double rounding = 1e-5 * (std::abs(double(exact[u][i])) + host.bounds[u][i]);
        worst = std::max(worst, error / (host.bounds[u][i] + rounding + 1e-30));
        largest_error = std::max(largest_error, error);
      }
    }
    EXPECT_LE(worst, 1.0) << test::describe(s) << ": an element past its bound";
    EXPECT_GT(largest_error, 0.0) << test::describe(s) << ": the reductions were not quantized";
  }
}

TEST(QuantizedReductions, RunsRepeatBitForBit) {
  std::vector<StrategyOptions> runs = {quantized(StrategyKind::zero2, ReductionQuantization::int4)};
  // Hybrid quantizes inside groups of more than one rank: pairs, at 4 ranks.
  if (test::world().size() >= 4) runs.push_back(quantized(StrategyKind::hybrid, ReductionQuantization::int8));
  for (const StrategyOptions& s : runs) {
    TrainOptions o = test::tiny_options(2);
    o.plan.strategy = s;
    o.plan.placement.param_dtype = DType::bf16;
    const test::RunResult a = test::train(o, test::world()), b = test::train(o, test::world());
    EXPECT_EQ(a.losses, b.losses) << test::describe(s);
    EXPECT_EQ(a.params, b.params) << test::describe(s);
    o.plan.strategy.quantize_reductions = ReductionQuantization::none;
    EXPECT_NE(test::train(o, test::world()).params, a.params) << test::describe(s) << ": nothing was quantized";
  }
}

TEST(QuantizedReductions, RefusedOnDdpAndForUnknownFormats) {
  PlanOptions o;
  o.strategy = quantized(StrategyKind::ddp, ReductionQuantization::int8);
  EXPECT_EQ(test::error_of([&] { validate_plan_options(o); }),
            "--quantize-reductions is only for --strategy zero1, zero2, zero3 or hybrid (ddp all-reduces: no rank "
            "owns a shard to sum)");
  EXPECT_EQ(test::error_of([] { parse_reduction_quantization("fp8"); }),
            "--quantize-reductions: unknown value 'fp8' (valid: none, int8, int4)");
  for (ReductionQuantization q : {ReductionQuantization::none, ReductionQuantization::int8, ReductionQuantization::int4})
    EXPECT_EQ(parse_reduction_quantization(reduction_quantization_name(q)), q);
}

}  // namespace
}  // namespace zshard
