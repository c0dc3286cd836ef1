// Sharded gradients free each unit's full gradient as its reduction lands: under zero2, zero3 and hybrid
// at most three full unit gradients are alive during backward (the one accumulated, the one in flight and
// one held open, as a tied embedding's is when its head adds to it first), however many units the model
// has; a unit too large to open beside a reduction in flight (a dominant embedding made ready last) opens
// alone, as GPT-2's and a tied Llama's do when their head's gradient waits for the embedding's backward;
// and the reduced shards are right, landed in place on a step's first micro-step and added on the next.
// zero1 keeps the scratch of two reductions at most.
// zshard-test-np: 2 4
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string_view>

#include <zshard/model_registry.h>

#include "kernels/allocator.h"
#include "models/gpt2.h"
#include "models/llama.h"
#include "shard/sharded_params.h"
#include "tests/support/model_checks.h"
#include "tests/support/test_support.h"

namespace zshard {
namespace {

// Twelve blocks of 0.2 M parameters each: deep enough that keeping every unit's full gradient would
// show, with units large enough that a reduction takes several polls to complete.
GPT2& deep_model() {
  static GPT2 model(gpt2_config_from(model_config("tiny", {{"layers", 12}, {"dim", 128}})));
  return model;
}

// Twelve small blocks under an embedding ten times their size, as GPT-2's 50257-token wte is beside its
// blocks.
GPT2& dominant_embedding_model() {
  static GPT2 model(gpt2_config_from(model_config("tiny", {{"layers", 12}, {"vocab", 8192}})));
  return model;
}

int64_t comm_peak() { return Allocator::of(Device::cpu).stats().peak[int(Category::comm)]; }
int64_t comm_live() { return Allocator::of(Device::cpu).stats().live[int(Category::comm)]; }

// Padded f32 bytes of each unit at a shard group of n, largest first.
std::vector<int64_t> unit_bytes_descending(const Model& model, int n) {
  std::vector<int64_t> bytes;
  for (const UnitSpec& u : model.units()) bytes.push_back(FlatLayout(u, n).padded_numel() * 4);
  std::sort(bytes.rbegin(), bytes.rend());
  return bytes;
}

// Every owned gradient element is `want`, the padding 0.
void expect_owned_grads(const ShardedParams& p, float want, std::string_view tag) {
  for (int u = 0; u < p.num_units(); ++u) {
    const FlatLayout& layout = p.layout(u);
    const float* g = p.owned_grads(u).data<float>();
    int64_t wrong = 0;
    for (int64_t j = 0; j < layout.shard_numel(); ++j) {
      const bool real = layout.shard_begin(p.shard_index()) + j < layout.numel();
      wrong += g[j] != (real ? want : 0.0f);
    }
    EXPECT_EQ(wrong, 0) << tag << " unit " << u;
  }
}

void fill_grads(ShardedParams& p, int unit, float value) {
  for (const Tensor& g : p.grads(unit)) std::fill_n(g.data<float>(), g.numel(), value);
}

// One micro-step of backward as GPT-2 runs it: unit 0's gradients open first and made ready last, the
// other units from the last to the first. Every rank adds rank + 1 + micro_step into each element.
void backward(ShardedParams& p, int micro_step) {
  const float value = float(test::world().rank() + 1 + micro_step);
  fill_grads(p, 0, value);
  for (int u = p.num_units() - 1; u >= 1; --u) {
    fill_grads(p, u, value);
    p.grads_ready(u);
  }
  p.grads_ready(0);
}

TEST(GradientMemory, AtMostThreeFullGradientsAliveAndShardsRight) {
  const int n = test::world().size();
  const std::vector<int64_t> unit_bytes = unit_bytes_descending(deep_model(), n);
  const int64_t three_largest = unit_bytes[0] + unit_bytes[1] + unit_bytes[2];
  for (StrategyKind k : {StrategyKind::zero2, StrategyKind::zero3, StrategyKind::hybrid}) {
    if (k == StrategyKind::hybrid && n < 4) continue;
    ShardedParams p(deep_model(), test::world(), test::plan({k, k == StrategyKind::hybrid ? ShardGroupRequest::equal(2) : ShardGroupRequest(), true, 2}), 7);
    Allocator::of(Device::cpu).reset_peaks();
    const int64_t before = comm_live();
    for (int micro = 0; micro < 2; ++micro) {
      p.begin_micro_step(true);
      backward(p, micro);
      p.end_micro_step();
    }
    // The second micro-step adds scratch shards for its two reductions in flight at most.
    const int64_t scratch = (unit_bytes[0] + unit_bytes[1]) / p.shard_group_size();
    EXPECT_LE(comm_peak() - before, three_largest + scratch) << strategy_name(k);

    // Each element: the sum over ranks of (rank + 1) + (rank + 2), over the replicas too.
    expect_owned_grads(p, float(n * (n + 1) / 2 + n * (n + 3) / 2), strategy_name(k));
  }
}

// Backward as GPT-2 runs it when the head's dwte waits for the embedding's backward: every unit from the
// last to the first, unit 0 opened last. Its gradient, far larger than two blocks', opens only once block
// 0's reduction has landed: it is never alive beside another full gradient.
TEST(GradientMemory, DominantUnitOpensAlone) {
  const int n = test::world().size();
  const std::vector<int64_t> unit_bytes = unit_bytes_descending(dominant_embedding_model(), n);
  ASSERT_GT(unit_bytes[0], 2 * unit_bytes[1]);
  for (StrategyKind k : {StrategyKind::zero2, StrategyKind::zero3, StrategyKind::hybrid}) {
    if (k == StrategyKind::hybrid && n < 4) continue;
    ShardedParams p(dominant_embedding_model(), test::world(), test::plan({k, k == StrategyKind::hybrid ? ShardGroupRequest::equal(2) : ShardGroupRequest(), true, 2}), 7);
    Allocator::of(Device::cpu).reset_peaks();
    const int64_t before = comm_live();
    p.begin_micro_step(true);
    const float value = float(test::world().rank() + 1);
    for (int u = p.num_units() - 1; u >= 0; --u) {
      fill_grads(p, u, value);
      p.grads_ready(u);
    }
    p.end_micro_step();
    EXPECT_EQ(comm_peak() - before, unit_bytes[0]) << strategy_name(k);
    expect_owned_grads(p, float(n * (n + 1) / 2), strategy_name(k));
  }
}

// A tied Llama with the same shape of problem: twelve layers under an embedding ten times their size.
Llama& dominant_embedding_llama() {
  static Llama model(
      llama_config_from(model_config("llama-tiny", {{"layers", 12}, {"vocab", 8192}, {"tie_embeddings", 1}})));
  return model;
}

// A model with a tied head and a dominant embedding, on a micro-batch of fewer tokens than channels: the
// head's weight gradient waits for the embedding's backward, so no strategy holds the tied unit's full
// gradient while the blocks run backward, and the whole step's comm peak is that one unit's (zero3's
// first micro-step gathers one unit at a time); added at the head, it is more. The reduced gradients are
// the same bits either way.
template <class TiedModel>
void expect_tied_gradient_opens_only_at_the_embedding(TiedModel& model) {
  const int n = test::world().size();
  const std::vector<int64_t> unit_bytes = unit_bytes_descending(model, n);
  ASSERT_GT(unit_bytes[0], 2 * unit_bytes[1]);
  const test::RandomTokens data(1, 32, model.config().vocab, 31 + test::world().rank());
  ASSERT_TRUE(model.defers_head_gradient(data.B, data.T));
  for (StrategyKind k : {StrategyKind::zero2, StrategyKind::zero3, StrategyKind::hybrid}) {
    if (k == StrategyKind::hybrid && n < 4) continue;
    std::vector<std::vector<float>> grads[2];
    for (HeadGradient when : {HeadGradient::deferred, HeadGradient::immediate}) {
      const bool deferred = when == HeadGradient::deferred;
      model.set_head_gradient(when);
      ShardedParams p(model, test::world(), test::plan({k, k == StrategyKind::hybrid ? ShardGroupRequest::equal(2) : ShardGroupRequest(), true, 2}), 7);
      Allocator::of(Device::cpu).reset_peaks();
      const int64_t before = comm_live();
      p.begin_micro_step(true);
      model.forward_backward(p, data.batch(), 1.0f);
      p.end_micro_step();
      if (deferred) {
        EXPECT_EQ(comm_peak() - before, unit_bytes[0]) << strategy_name(k);
      } else {
        EXPECT_GT(comm_peak() - before, unit_bytes[0]) << strategy_name(k);
      }
      for (int u = 0; u < p.num_units(); ++u) {
        const Tensor g = p.owned_grads(u);
        grads[deferred].emplace_back(g.data<float>(), g.data<float>() + g.numel());
      }
    }
    model.set_head_gradient(HeadGradient::by_tokens);
    for (size_t u = 0; u < grads[0].size(); ++u)
      EXPECT_EQ(std::memcmp(grads[0][u].data(), grads[1][u].data(), grads[0][u].size() * sizeof(float)), 0)
          << strategy_name(k) << " unit " << u;
  }
}

TEST(GradientMemory, TiedGradientOpensOnlyAtTheEmbeddingAndGivesTheSameBits) {
  expect_tied_gradient_opens_only_at_the_embedding(dominant_embedding_model());
}

TEST(GradientMemory, TiedLlamaGradientOpensOnlyAtTheEmbeddingAndGivesTheSameBits) {
  expect_tied_gradient_opens_only_at_the_embedding(dominant_embedding_llama());
}

TEST(GradientMemory, Zero1KeepsTwoScratchShardsAtMost) {
  const int n = test::world().size();
  const std::vector<int64_t> unit_bytes = unit_bytes_descending(deep_model(), n);
  ShardedParams p(deep_model(), test::world(), test::plan({StrategyKind::zero1}), 7);
  Allocator::of(Device::cpu).reset_peaks();
  const int64_t before = comm_live();
  p.begin_micro_step(true);
  backward(p, 0);
  p.end_micro_step();
  EXPECT_LE(comm_peak() - before, (unit_bytes[0] + unit_bytes[1]) / n);
}

}  // namespace
}  // namespace zshard
