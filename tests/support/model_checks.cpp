#include "tests/support/model_checks.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "kernels/allocator.h"
#include "tests/support/test_support.h"

namespace zshard::test {

RandomTokens::RandomTokens(int b, int t, int vocab, uint64_t seed) : B(b), T(t) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  for (int i = 0; i < b * t; ++i) inputs.push_back(token(rng));
  for (int i = 0; i < b * t; ++i) targets.push_back(token(rng));
}

void randomize_params(LocalParams& ctx, double std, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, std);
  for (int u = 0; u < ctx.num_units(); ++u)
    for (const Tensor& p : ctx.param_tensors(u)) {
      std::vector<double> values(size_t(p.numel()));
      for (double& v : values) v = normal(rng);
      assign_doubles(p, values);
    }
}

double expect_gradients_match_finite_differences(Model& model, LocalParams& ctx, const RandomTokens& data,
                                                 double tol, double h) {
  model.forward_backward(ctx, data.batch(), 1.0f);
  ctx.check_micro_step_closed(true);  // the protocol, as the engine checks it
  const std::vector<UnitSpec> units = model.units();
  double worst = 0;
  for (int u = 0; u < ctx.num_units(); ++u)
    for (size_t i = 0; i < units[u].params.size(); ++i) {
      if (!ctx.grad_tensors(u)[i].defined()) continue;  // frozen: nothing to compare
      double* x = ctx.param_tensors(u)[i].data<double>();
      std::vector<double> numeric(size_t(units[u].params[i].numel()));
      for (size_t j = 0; j < numeric.size(); ++j) {
        const double saved = x[j];
        x[j] = saved + h;
        const double plus = model.forward(ctx, data.batch());
        x[j] = saved - h;
        const double minus = model.forward(ctx, data.batch());
        x[j] = saved;
        numeric[j] = (plus - minus) / (2 * h);
      }
      const double err = max_rel_diff(to_doubles(ctx.grad_tensors(u)[i]), numeric);
      EXPECT_LE(err, tol) << units[u].params[i].name;
      worst = std::max(worst, err);
    }
  return worst;
}

void expect_recompute_bit_identical(Model& model, const LocalParams& params, DType dtype,
                                        const RandomTokens& data) {
  LocalParams plain(model, dtype), recomputed(model, dtype);
  plain.copy_params_from(params);
  recomputed.copy_params_from(params);
  model.set_recompute(Recompute::none);
  const double loss_plain = model.forward_backward(plain, data.batch(), 0.25f);
  model.set_recompute(Recompute::blocks);
  const double loss_recomputed = model.forward_backward(recomputed, data.batch(), 0.25f);
  model.set_recompute(Recompute::none);

  EXPECT_EQ(std::memcmp(&loss_plain, &loss_recomputed, sizeof(double)), 0) << loss_plain << " vs " << loss_recomputed;
  const std::vector<UnitSpec> units = model.units();
  for (int u = 0; u < plain.num_units(); ++u)
    for (size_t i = 0; i < units[u].params.size(); ++i) {
      const Tensor &a = plain.grad_tensors(u)[i], &b = recomputed.grad_tensors(u)[i];
      if (!a.defined()) continue;  // frozen
      EXPECT_EQ(std::memcmp(a.raw(), b.raw(), size_t(a.nbytes())), 0) << units[u].params[i].name;
    }
  ASSERT_EQ(plain.events().size(), recomputed.events().size());
  for (size_t e = 0; e < plain.events().size(); ++e) {
    EXPECT_EQ(plain.events()[e].call, recomputed.events()[e].call) << "protocol call " << e;
    EXPECT_EQ(plain.events()[e].unit, recomputed.events()[e].unit) << "protocol call " << e;
  }
}

void expect_deferred_head_bit_identical(Model& model, const std::function<void(HeadGradient)>& set_head_gradient,
                                        const LocalParams& params, const RandomTokens& data) {
  for (DType dtype : {DType::f32, DType::f64})
    for (Recompute mode : {Recompute::none, Recompute::blocks}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (mode == Recompute::blocks ? " blocks" : ""));
      model.set_recompute(mode);
      LocalParams at_head(model, dtype), deferred(model, dtype);
      double losses[2] = {0, 0};
      for (auto [ctx, when, loss] : {std::tuple{&at_head, HeadGradient::immediate, &losses[0]},
                                     std::tuple{&deferred, HeadGradient::deferred, &losses[1]}}) {
        ctx->copy_params_from(params);
        set_head_gradient(when);
        for (int micro_step = 0; micro_step < 2; ++micro_step)
          *loss += model.forward_backward(*ctx, data.batch(), 0.5f);
      }
      EXPECT_EQ(std::memcmp(&losses[0], &losses[1], sizeof(double)), 0) << losses[0] << " vs " << losses[1];
      for (int u = 0; u < at_head.num_units(); ++u)
        for (size_t i = 0; i < at_head.grad_tensors(u).size(); ++i) {
          const Tensor &a = at_head.grad_tensors(u)[i], &b = deferred.grad_tensors(u)[i];
          if (!a.defined()) continue;  // frozen
          EXPECT_EQ(std::memcmp(a.raw(), b.raw(), size_t(a.nbytes())), 0) << "unit " << u << " param " << i;
        }
    }
  model.set_recompute(Recompute::none);
  set_head_gradient(HeadGradient::by_tokens);
}

void expect_tied_gradient_opens(Model& model, const RandomTokens& data, bool deferred) {
  LocalParams ctx(model, DType::f32);
  ctx.init(model, 23);
  model.forward_backward(ctx, data.batch(), 1.0f);
  const std::vector<LocalParams::Event>& events = ctx.events();
  using Call = LocalParams::Call;
  const auto first = [&](Call call, int unit) {
    return std::find_if(events.begin(), events.end(), [&](auto e) { return e.call == call && e.unit == unit; }) -
           events.begin();
  };
  const auto opened = first(Call::grads, 0);
  if (deferred) {
    EXPECT_GT(opened, first(Call::grads_ready, 1));
  } else {
    EXPECT_LT(opened, first(Call::grads, ctx.num_units() - 1));
  }
}

std::pair<int64_t, int64_t> expect_recompute_shrinks_activations(Model& model, const RandomTokens& data) {
  const auto live = [] { return Allocator::of(Device::cpu).stats().live[int(Category::activations)]; };
  const int64_t before = live();
  int64_t bytes[2] = {0, 0};
  {
    LocalParams ctx(model, DType::f32);
    randomize_params(ctx, 0.1, 5);
    for (Recompute mode : {Recompute::none, Recompute::blocks}) {
      model.set_recompute(mode);
      model.forward_backward(ctx, data.batch(), 1.0f);
      bytes[int(mode)] = model.activation_bytes(data.B, data.T, DType::f32);
      EXPECT_EQ(live() - before, bytes[int(mode)]) << "mode " << int(mode);
    }
    model.set_recompute(Recompute::none);
  }
  EXPECT_LT(bytes[1], bytes[0]);
  return {bytes[0], bytes[1]};
}

void expect_fused_attention_matches_blocks(Model& model, const LocalParams& params, DType dtype,
                                           const RandomTokens& data, double tol) {
  const auto live = [] { return Allocator::of(Device::cpu).stats().live[int(Category::activations)]; };
  const int64_t before = live();  // a model that has not run holds no activations
  const std::vector<UnitSpec> units = model.units();
  for (Recompute mode : {Recompute::none, Recompute::blocks}) {
    SCOPED_TRACE(mode == Recompute::blocks ? "checkpointed" : "not checkpointed");
    model.set_recompute(mode);
    LocalParams blocks(model, dtype), fused(model, dtype);
    blocks.copy_params_from(params);
    fused.copy_params_from(params);
    int64_t bytes[2] = {0, 0};
    double losses[2] = {0, 0};
    for (auto [ctx, kernel, i] : {std::tuple{&blocks, AttentionKernel::blocks, 0},
                                  std::tuple{&fused, AttentionKernel::fused, 1}}) {
      model.set_attention(kernel);
      losses[i] = model.forward_backward(*ctx, data.batch(), 0.25f);
      bytes[i] = model.activation_bytes(data.B, data.T, dtype);
      EXPECT_EQ(live() - before, bytes[i]) << (i ? "fused" : "blocks");
    }
    EXPECT_LT(bytes[1], bytes[0]);
    EXPECT_NEAR(losses[1], losses[0], tol * std::abs(losses[0]));
    for (int u = 0; u < blocks.num_units(); ++u)
      for (size_t i = 0; i < units[u].params.size(); ++i) {
        const Tensor &a = blocks.grad_tensors(u)[i], &b = fused.grad_tensors(u)[i];
        if (a.defined()) EXPECT_LE(max_rel_diff(to_doubles(b), to_doubles(a)), tol) << units[u].params[i].name;
      }
    ASSERT_EQ(blocks.events().size(), fused.events().size());
    for (size_t e = 0; e < blocks.events().size(); ++e) {
      EXPECT_EQ(blocks.events()[e].call, fused.events()[e].call) << "protocol call " << e;
      EXPECT_EQ(blocks.events()[e].unit, fused.events()[e].unit) << "protocol call " << e;
    }
  }
  model.set_recompute(Recompute::none);
  model.set_attention(AttentionKernel::blocks);
}

}  // namespace zshard::test
