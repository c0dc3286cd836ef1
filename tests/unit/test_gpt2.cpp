// GPT-2: configs, units and init, the forward against a direct transcription of Hugging Face's
// GPT2LMHeadModel, every gradient against finite differences, f32 against f64, and the param protocol.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <random>
#include <string>
#include <tuple>

#include <zshard/error.h>
#include <zshard/ops.h>
#include <zshard/testing.h>

#include "kernels/allocator.h"
#include "models/gpt2.h"
#include "tests/support/model_checks.h"
#include "tests/support/test_support.h"

namespace zshard {
namespace {

using test::max_rel_diff;
using Call = LocalParams::Call;
using ::testing::HasSubstr;

// Small enough to finite-difference every parameter element.
GPT2Config micro() { return {.layers = 2, .dim = 8, .heads = 2, .vocab = 13, .ctx = 8}; }

int64_t live_activation_bytes() {
  return Allocator::of(Device::cpu).stats().live[int(Category::activations)];
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Hugging Face's GPT2LMHeadModel forward (eval mode) transcribed into plain loops in double, sharing no
// code with the model: the sum of the token losses.
double reference_loss(const GPT2Config& c, const LocalParams& ctx, const test::RandomTokens& data) {
  using Vec = std::vector<double>;
  const int T = data.T, C = c.dim, NH = c.heads, hs = C / NH, V = c.vocab;
  const auto param = [&](int unit, int i) { return to_doubles(ctx.param_tensors(unit)[i]); };
  const auto layernorm = [&](const Vec& x, const Vec& w, const Vec& b) {
    Vec out(x.size());
    for (int t = 0; t < T; ++t) {
      double mean = 0, var = 0;
      for (int i = 0; i < C; ++i) mean += x[t * C + i] / C;
      for (int i = 0; i < C; ++i) var += (x[t * C + i] - mean) * (x[t * C + i] - mean) / C;
      const double rstd = 1 / std::sqrt(var + 1e-5);
      for (int i = 0; i < C; ++i) out[t * C + i] = (x[t * C + i] - mean) * rstd * w[i] + b[i];
    }
    return out;
  };
  const auto conv1d = [&](const Vec& x, int in, const Vec& w, const Vec& b) {  // x @ w + b, w (in, out)
    const int out_dim = int(b.size());
    Vec out(size_t(T) * out_dim);
    for (int t = 0; t < T; ++t)
      for (int o = 0; o < out_dim; ++o) {
        double sum = b[o];
        for (int i = 0; i < in; ++i) sum += x[t * in + i] * w[i * out_dim + o];
        out[t * out_dim + o] = sum;
      }
    return out;
  };
  const auto gelu_new = [](double x) {
    return 0.5 * x * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
  };
  const Vec wte = param(0, 0), wpe = param(0, 1);
  double total = 0;
  for (int b = 0; b < data.B; ++b) {
    const int32_t* tokens = data.inputs.data() + b * T;
    Vec x(size_t(T) * C);
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < C; ++i) x[t * C + i] = wte[tokens[t] * C + i] + wpe[t * C + i];
    for (int l = 0; l < c.layers; ++l) {
      const auto p = [&](int i) { return param(1 + l, i); };
      const Vec qkv = conv1d(layernorm(x, p(0), p(1)), C, p(2), p(3));
      Vec y(size_t(T) * C, 0.0);
      for (int h = 0; h < NH; ++h) {
        // Head h's channel d of q, k or v (c_attn's output is [q | k | v]) at position t.
        const auto qkv_at = [&](int which, int t, int d) { return qkv[t * 3 * C + which * C + h * hs + d]; };
        for (int t = 0; t < T; ++t) {
          Vec score(t + 1);
          double max_score = -1e300, norm = 0;
          for (int s = 0; s <= t; ++s) {  // causal: position t attends to 0..t
            double dot = 0;
            for (int d = 0; d < hs; ++d) dot += qkv_at(0, t, d) * qkv_at(1, s, d);
            score[s] = dot / std::sqrt(double(hs));
            max_score = std::max(max_score, score[s]);
          }
          for (double& s : score) norm += (s = std::exp(s - max_score));
          for (int s = 0; s <= t; ++s)
            for (int d = 0; d < hs; ++d) y[t * C + h * hs + d] += score[s] / norm * qkv_at(2, s, d);
        }
      }
      const Vec attn = conv1d(y, C, p(4), p(5));
      for (size_t i = 0; i < x.size(); ++i) x[i] += attn[i];
      Vec fc = conv1d(layernorm(x, p(6), p(7)), C, p(8), p(9));
      for (double& v : fc) v = gelu_new(v);
      const Vec mlp = conv1d(fc, 4 * C, p(10), p(11));
      for (size_t i = 0; i < x.size(); ++i) x[i] += mlp[i];
    }
    const Vec h = layernorm(x, param(c.layers + 1, 0), param(c.layers + 1, 1));
    for (int t = 0; t < T; ++t) {
      Vec logits(V);
      double max_logit = -1e300, norm = 0;
      for (int v = 0; v < V; ++v) {
        for (int i = 0; i < C; ++i) logits[v] += h[t * C + i] * wte[v * C + i];
        max_logit = std::max(max_logit, logits[v]);
      }
      for (double logit : logits) norm += std::exp(logit - max_logit);
      total += max_logit + std::log(norm) - logits[data.targets[b * T + t]];
    }
  }
  return total;
}

TEST(GPT2Config, NamedConfigsAndParamCounts) {
  EXPECT_EQ(gpt2_config("tiny").num_params(), 256 * 64 + 128 * 64 + 2 * (12 * 64 * 64 + 13 * 64) + 2 * 64);
  // The Hugging Face parameter counts of the released models.
  EXPECT_EQ(gpt2_config("gpt2").num_params(), 124439808);
  EXPECT_EQ(gpt2_config("gpt2-medium").num_params(), 354823168);
  EXPECT_EQ(gpt2_config("gpt2-large").num_params(), 774030080);
  EXPECT_EQ(gpt2_config("gpt2-xl").num_params(), 1557611200);
  for (const std::string& name : gpt2_config_names()) {
    const GPT2 model(gpt2_config(name));
    int64_t numel = 0;
    for (const UnitSpec& unit : model.units())
      for (const ParamSpec& p : unit.params) numel += p.numel();
    EXPECT_EQ(numel, model.config().num_params()) << name;
  }
}

TEST(GPT2Config, ErrorsAreClear) {
  const std::string unknown = error_of([] { gpt2_config("gpt3"); });
  EXPECT_TRUE(contains(unknown, "'gpt3'")) << unknown;
  for (const std::string& name : gpt2_config_names()) EXPECT_TRUE(contains(unknown, name)) << unknown;
  const std::string divisible = error_of([] { GPT2Config{2, 10, 3, 16, 8}.validate(); });
  EXPECT_TRUE(contains(divisible, "dim 10 is not divisible by heads 3")) << divisible;
  const std::string positive = error_of([] { GPT2 model({0, 8, 2, 16, 8}); });
  EXPECT_TRUE(contains(positive, "must all be positive")) << positive;
}

TEST(GPT2, UnitsCarryHuggingFaceNamesShapesAndDecay) {
  const GPT2 model(gpt2_config("tiny"));
  const std::vector<UnitSpec> units = model.units();
  ASSERT_EQ(units.size(), 4u);
  EXPECT_EQ(units[0].name, "embed");
  EXPECT_EQ(units[2].name, "h.1");
  EXPECT_EQ(units[3].name, "ln_f");
  ASSERT_EQ(units[0].params.size(), 2u);
  EXPECT_EQ(units[0].params[0].name, "wte.weight");
  EXPECT_EQ(units[0].params[0].shape, (Shape{256, 64}));
  EXPECT_EQ(units[0].params[1].shape, (Shape{128, 64}));
  EXPECT_TRUE(units[0].params[1].weight_decay);
  const std::vector<std::tuple<std::string, Shape, bool>> block = {
      {"h.1.ln_1.weight", {64}, false},          {"h.1.ln_1.bias", {64}, false},
      {"h.1.attn.c_attn.weight", {64, 192}, true}, {"h.1.attn.c_attn.bias", {192}, false},
      {"h.1.attn.c_proj.weight", {64, 64}, true},  {"h.1.attn.c_proj.bias", {64}, false},
      {"h.1.ln_2.weight", {64}, false},          {"h.1.ln_2.bias", {64}, false},
      {"h.1.mlp.c_fc.weight", {64, 256}, true},    {"h.1.mlp.c_fc.bias", {256}, false},
      {"h.1.mlp.c_proj.weight", {256, 64}, true},  {"h.1.mlp.c_proj.bias", {64}, false}};
  ASSERT_EQ(units[2].params.size(), block.size());
  for (size_t i = 0; i < block.size(); ++i) {
    EXPECT_EQ(units[2].params[i].name, std::get<0>(block[i]));
    EXPECT_EQ(units[2].params[i].shape, std::get<1>(block[i])) << std::get<0>(block[i]);
    EXPECT_EQ(units[2].params[i].weight_decay, std::get<2>(block[i])) << std::get<0>(block[i]);
  }
  EXPECT_EQ(units[3].params[0].name, "ln_f.weight");
  EXPECT_FALSE(units[3].params[0].weight_decay);
}

TEST(GPT2, InitIsDeterministicAndFollowsHuggingFace) {
  const GPT2 model(gpt2_config("tiny"));
  LocalParams a(model, DType::f64), b(model, DType::f64), c(model, DType::f64), f(model, DType::f32);
  a.init(model, 42);
  b.init(model, 42);
  c.init(model, 43);
  f.init(model, 42);
  for (int u = 0; u < a.num_units(); ++u)
    for (size_t i = 0; i < a.param_tensors(u).size(); ++i) {
      const std::vector<double> x = to_doubles(a.param_tensors(u)[i]);
      EXPECT_EQ(x, to_doubles(b.param_tensors(u)[i]));
      std::vector<double> rounded = x;
      for (double& v : rounded) v = double(float(v));
      EXPECT_EQ(rounded, to_doubles(f.param_tensors(u)[i]));  // f32 init = the f64 values rounded
    }
  EXPECT_NE(to_doubles(a.param_tensors(0)[0]), to_doubles(c.param_tensors(0)[0]));

  const auto expect_normal = [](const Tensor& t, double std, const char* what) {
    double sum = 0, sum_sq = 0;
    for (double v : to_doubles(t)) sum += v, sum_sq += v * v;
    const double n = double(t.numel());
    EXPECT_NEAR(sum / n, 0.0, 5 * std / std::sqrt(n)) << what;
    EXPECT_NEAR(std::sqrt(sum_sq / n), std, 0.05 * std) << what;
  };
  expect_normal(a.param_tensors(0)[0], 0.02, "wte");
  expect_normal(a.param_tensors(0)[1], 0.02, "wpe");
  expect_normal(a.param_tensors(1)[2], 0.02, "c_attn.weight");
  expect_normal(a.param_tensors(1)[8], 0.02, "c_fc.weight");
  expect_normal(a.param_tensors(1)[4], 0.02 / 2, "attn.c_proj.weight");  // 0.02 / sqrt(2 * layers)
  expect_normal(a.param_tensors(2)[10], 0.02 / 2, "mlp.c_proj.weight");
  for (int i : {0, 6}) EXPECT_EQ(to_doubles(a.param_tensors(1)[i]), std::vector<double>(64, 1.0));
  for (int i : {1, 3, 5, 7, 9, 11})
    for (double v : to_doubles(a.param_tensors(2)[i])) EXPECT_EQ(v, 0.0);
  EXPECT_EQ(to_doubles(a.param_tensors(3)[0]), std::vector<double>(64, 1.0));
}

TEST(GPT2, ForwardEqualsHuggingFaceTranscription) {
  GPT2 model(micro());
  LocalParams ctx(model, DType::f64), ctx32(model, DType::f32);
  test::randomize_params(ctx, 0.3, 1);
  ctx32.copy_params_from(ctx);
  const test::RandomTokens data(2, micro().ctx, micro().vocab, 2);
  const double reference = reference_loss(micro(), ctx, data);
  EXPECT_NEAR(model.forward(ctx, data.batch()), reference, 1e-12 * reference);
  EXPECT_NEAR(model.forward_backward(ctx, data.batch(), 1.0f), reference, 1e-12 * reference);
  EXPECT_NEAR(model.forward(ctx32, data.batch()), reference, 1e-5 * reference);
}

// Metric: for each parameter tensor, max_i |analytic_i - numeric_i| / max_i |numeric_i|, where numeric
// is the central difference (L(x+h) - L(x-h)) / 2h of the summed token loss, h = 1e-5, every element.
// Both timings of the head's dwte: 10 tokens are not fewer than the 8 channels (at the head), 5 are
// (deferred to the embedding's backward).
TEST(GPT2, EveryGradientMatchesFiniteDifferencesInDouble) {
  GPT2 model(micro());
  for (const auto [B, deferred] : {std::pair{2, false}, std::pair{1, true}}) {
    SCOPED_TRACE(deferred ? "deferred dwte" : "dwte at the head");
    ASSERT_EQ(model.defers_head_gradient(B, 5), deferred);
    LocalParams ctx(model, DType::f64);
    test::randomize_params(ctx, 0.3, 3);
    const test::RandomTokens data(B, 5, micro().vocab, 4);
    const double worst = test::expect_gradients_match_finite_differences(model, ctx, data);
    RecordProperty(deferred ? "worst_rel_error_deferred" : "worst_rel_error", std::to_string(worst));
    std::printf("worst relative gradient error over %lld params (%s): %.3g\n", (long long)micro().num_params(),
                deferred ? "deferred dwte" : "dwte at the head", worst);
  }
}

// The same params in f32 and f64: losses and every gradient agree to f32 accuracy.
void expect_float_matches_double(const GPT2Config& config, const LocalParams& params64,
                                 const test::RandomTokens& data, double tol) {
  GPT2 model(config);
  LocalParams ctx64(model, DType::f64), ctx32(model, DType::f32);
  ctx64.copy_params_from(params64);
  ctx32.copy_params_from(params64);
  const double loss64 = model.forward_backward(ctx64, data.batch(), 1.0f);
  const double loss32 = model.forward_backward(ctx32, data.batch(), 1.0f);
  EXPECT_NEAR(loss32, loss64, tol * loss64);
  const std::vector<UnitSpec> units = model.units();
  for (int u = 0; u < ctx64.num_units(); ++u)
    for (size_t i = 0; i < units[u].params.size(); ++i)
      EXPECT_LE(max_rel_diff(to_doubles(ctx32.grad_tensors(u)[i]), to_doubles(ctx64.grad_tensors(u)[i])), tol)
          << units[u].params[i].name;
}

TEST(GPT2, FloatMatchesDouble) {
  {
    GPT2 model(micro());
    LocalParams params(model, DType::f64);
    test::randomize_params(params, 0.3, 5);
    expect_float_matches_double(micro(), params, test::RandomTokens(2, 5, micro().vocab, 6), 1e-5);
  }
  {
    const GPT2Config tiny = gpt2_config("tiny");
    GPT2 model(tiny);
    LocalParams params(model, DType::f64);
    params.init(model, 7);
    expect_float_matches_double(tiny, params, test::RandomTokens(2, 32, tiny.vocab, 8), 1e-5);
  }
}

// Checks a micro-step's calls: gathers and releases pair up, grads are only taken before the unit's
// grads_ready, each unit's grads_ready comes once, after its release, in reverse order, unit 0 last.
void expect_backward_protocol(const LocalParams& ctx) {
  const int n = ctx.num_units();
  std::vector<int> outstanding(n, 0);
  std::vector<bool> ready(n, false);
  std::vector<int> ready_order;
  for (const LocalParams::Event& e : ctx.events()) {
    switch (e.call) {
      case Call::gather: ++outstanding[e.unit]; break;
      case Call::release: --outstanding[e.unit]; break;
      case Call::grads: EXPECT_FALSE(ready[e.unit]) << "grads(" << e.unit << ") after grads_ready"; break;
      case Call::grads_ready:
        EXPECT_FALSE(ready[e.unit]) << "grads_ready(" << e.unit << ") twice";
        EXPECT_EQ(outstanding[e.unit], 0) << "grads_ready(" << e.unit << ") before its release";
        ready[e.unit] = true;
        ready_order.push_back(e.unit);
        break;
    }
  }
  std::vector<int> expected_order;
  for (int u = n - 1; u >= 0; --u) expected_order.push_back(u);
  EXPECT_EQ(ready_order, expected_order);
  for (int u = 0; u < n; ++u) {
    EXPECT_EQ(outstanding[u], 0) << "unit " << u;
    EXPECT_EQ(ctx.count(Call::gather, u), ctx.count(Call::release, u)) << "unit " << u;
    EXPECT_EQ(ctx.count(Call::grads_ready, u), 1) << "unit " << u;
    // Forward and backward once each; unit 0's second gather is the tied head (logits and dwte), and
    // the embedding backward gathers nothing.
    EXPECT_EQ(ctx.count(Call::gather, u), 2) << "unit " << u;
  }
  ASSERT_FALSE(ctx.events().empty());
  EXPECT_EQ(ctx.events().back().call, Call::grads_ready);
  EXPECT_EQ(ctx.events().back().unit, 0);
}

TEST(GPT2, FollowsTheParamProtocol) {
  const GPT2Config tiny = gpt2_config("tiny");
  GPT2 model(tiny);
  LocalParams ctx(model, DType::f32);
  ctx.init(model, 9);
  const test::RandomTokens data(2, 16, tiny.vocab, 10);
  for (int micro_step = 0; micro_step < 2; ++micro_step) {
    ctx.clear_events();
    model.forward_backward(ctx, data.batch(), 1.0f);
    SCOPED_TRACE(micro_step);
    expect_backward_protocol(ctx);
    ctx.check_micro_step_closed(true);
  }
  ctx.clear_events();
  model.forward(ctx, data.batch());
  ctx.check_micro_step_closed(false);
  for (int u = 0; u < ctx.num_units(); ++u) {
    EXPECT_EQ(ctx.count(Call::gather, u), ctx.count(Call::release, u));
    EXPECT_EQ(ctx.count(Call::grads, u), 0);
    EXPECT_EQ(ctx.count(Call::grads_ready, u), 0);
  }
}

// A model whose tests pass under LocalParams is not refused by the engine for its protocol: the checking
// context refuses what the engine does.
TEST(LocalParams, RefusesWhatTheEngineRefuses) {
  GPT2 model(gpt2_config("tiny"));
  LocalParams ctx(model, DType::f32);
  EXPECT_THAT(test::error_of([&] { ctx.grads_ready(1); }), HasSubstr("grads_ready(1) without grads()"));
  ctx.grads(1);
  ctx.grads_ready(1);
  EXPECT_THAT(test::error_of([&] { ctx.grads_ready(1); }), HasSubstr("grads_ready(1) twice"));
  EXPECT_THAT(test::error_of([&] { ctx.check_micro_step_closed(true); }),
              HasSubstr("unit 0: no grads_ready() in this micro-step's backward"));
  // A backward that hands nothing back at all.
  EXPECT_THAT(test::error_of([&] { ctx.check_micro_step_closed(true); }), HasSubstr("unit 0: no grads_ready()"));
  ctx.gather(2);
  EXPECT_THAT(test::error_of([&] { ctx.check_micro_step_closed(false); }), HasSubstr("unit 2 still gathered"));
  ctx.grads(0);
  EXPECT_THAT(test::error_of([&] { ctx.check_micro_step_closed(false); }),
              HasSubstr("unit 0: grads() without grads_ready() in this micro-step"));
  ctx.check_micro_step_closed(false);  // each check started the next micro-step with nothing held
}

// Gradients accumulate across micro-steps and scale with loss_scale.
TEST(GPT2, GradientsAccumulateAndScale) {
  GPT2 model(micro());
  LocalParams ctx(model, DType::f64);
  test::randomize_params(ctx, 0.3, 11);
  const test::RandomTokens data(2, 5, micro().vocab, 12);
  model.forward_backward(ctx, data.batch(), 1.0f);
  std::vector<std::vector<double>> once;
  for (int u = 0; u < ctx.num_units(); ++u)
    for (const Tensor& g : ctx.grad_tensors(u)) once.push_back(to_doubles(g));
  ctx.zero_grads();
  model.forward_backward(ctx, data.batch(), 0.25f);
  model.forward_backward(ctx, data.batch(), 0.75f);
  size_t k = 0;
  for (int u = 0; u < ctx.num_units(); ++u)
    for (const Tensor& g : ctx.grad_tensors(u)) EXPECT_LE(max_rel_diff(to_doubles(g), once[k++]), 1e-12);
}

TEST(GPT2, InitialLossIsLogVocab) {
  const GPT2Config tiny = gpt2_config("tiny");
  GPT2 model(tiny);
  LocalParams ctx(model, DType::f32);
  ctx.init(model, 13);
  const test::RandomTokens data(4, 64, tiny.vocab, 14);
  const double mean_loss = model.forward(ctx, data.batch()) / (data.B * data.T);
  EXPECT_NEAR(mean_loss, std::log(double(tiny.vocab)), 0.1);
}

TEST(GPT2, ActivationBytesMatchTheAllocator) {
  const GPT2Config tiny = gpt2_config("tiny");
  const int64_t before = live_activation_bytes();
  {
    GPT2 model(tiny);
    LocalParams ctx32(model, DType::f32), ctx64(model, DType::f64);
    ctx32.init(model, 15);
    ctx64.init(model, 15);
    for (auto [B, T] : {std::pair{2, 16}, std::pair{3, 8}, std::pair{3, 8}, std::pair{1, tiny.ctx}}) {
      const test::RandomTokens data(B, T, tiny.vocab, 16);
      model.forward_backward(ctx32, data.batch(), 1.0f);
      EXPECT_EQ(live_activation_bytes() - before, model.activation_bytes(B, T, DType::f32)) << B << "x" << T;
    }
    const test::RandomTokens data(2, 16, tiny.vocab, 17);
    model.forward(ctx64, data.batch());
    EXPECT_EQ(live_activation_bytes() - before, model.activation_bytes(2, 16, DType::f64));
  }
  EXPECT_EQ(live_activation_bytes(), before);
}

// tiny with more blocks, so that every block's forward and recompute reuses the one slot.
GPT2Config deep_tiny() {
  GPT2Config c = gpt2_config("tiny");
  c.layers = 6;
  return c;
}

TEST(GPT2, CheckpointingGivesTheSameBits) {
  const GPT2Config tiny = deep_tiny();
  GPT2 model(tiny);
  LocalParams params(model, DType::f64);
  test::randomize_params(params, 0.1, 18);
  const test::RandomTokens data(2, 24, tiny.vocab, 19);
  for (DType dtype : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dtype));
    test::expect_recompute_bit_identical(model, params, dtype, data);
  }
}

// The tied head's dwte added at the head or deferred to the embedding's backward: the same losses and
// gradient bits over two accumulated micro-steps, with and without checkpointing, in f32 and f64.
TEST(GPT2, DeferredHeadGradientGivesTheSameBits) {
  const GPT2Config tiny = deep_tiny();
  GPT2 model(tiny);
  LocalParams params(model, DType::f64);
  test::randomize_params(params, 0.1, 21);
  test::expect_deferred_head_bit_identical(
      model, [&](HeadGradient when) { model.set_head_gradient(when); }, params, {2, 24, tiny.vocab, 22});
}

// By default the head's dwte waits for the embedding's backward when the micro-batch has fewer tokens than
// channels: unit 0's gradients are then first asked for after every other unit's are ready, so no
// full-size gradient of the tied unit is open while the blocks run backward. Otherwise the head asks first.
TEST(GPT2, TiedGradientOpensAtTheEmbeddingWithFewerTokensThanChannels) {
  const GPT2Config tiny = gpt2_config("tiny");  // 64 channels
  GPT2 model(tiny);
  for (const auto [B, deferred] : {std::pair{2, true}, std::pair{4, false}}) {  // 32 and 64 tokens of 16
    SCOPED_TRACE(B);
    EXPECT_EQ(model.defers_head_gradient(B, 16), deferred);
    test::expect_tied_gradient_opens(model, {B, 16, tiny.vocab, 24}, deferred);
  }
}

TEST(GPT2, CheckpointingShrinksActivationsAsAllocated) {
  const GPT2Config tiny = deep_tiny();
  GPT2 model(tiny);
  const auto [none, blocks] = test::expect_recompute_shrinks_activations(model, {2, 32, tiny.vocab, 20});
  // Six blocks' intermediates down to one block's: well over half of the bytes go.
  EXPECT_LT(blocks * 2, none);
}

// Fused attention keeps each query row's softmax statistics instead of the probabilities: the same losses
// and gradients as blocks but for rounding (f64 to 1e-12, f32 to 1e-5), the same protocol, fewer
// activation bytes. T = 70 crosses the CPU kernel's row blocks.
TEST(GPT2, FusedAttentionMatchesBlocks) {
  const GPT2Config tiny = deep_tiny();
  for (const auto [dtype, tol] : {std::pair{DType::f64, 1e-12}, std::pair{DType::f32, 1e-5}}) {
    SCOPED_TRACE(dtype_name(dtype));
    GPT2 model(tiny);
    LocalParams params(model, DType::f64);
    test::randomize_params(params, 0.1, 25);
    test::expect_fused_attention_matches_blocks(model, params, dtype, {2, 70, tiny.vocab, 26}, tol);
  }
}

// Fused attention's statistics are kept with the norms' in every dtype, bf16's fp32 ones too: recomputed
// blocks give the same bits.
TEST(GPT2, FusedAttentionCheckpointingGivesTheSameBits) {
  const GPT2Config tiny = deep_tiny();
  GPT2 model(tiny);
  model.set_attention(AttentionKernel::fused);
  LocalParams params(model, DType::f64);
  test::randomize_params(params, 0.1, 29);
  for (DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    test::expect_recompute_bit_identical(model, params, dtype, {2, 24, tiny.vocab, 30});
  }
}

TEST(GPT2, FusedAttentionGradientsMatchFiniteDifferencesInDouble) {
  GPT2 model(micro());
  model.set_attention(AttentionKernel::fused);
  LocalParams ctx(model, DType::f64);
  test::randomize_params(ctx, 0.3, 27);
  test::expect_gradients_match_finite_differences(model, ctx, {2, 5, micro().vocab, 28});
}

// automatic becomes fused where it runs (the cpu, every dtype) and the model has it; a model of one's own
// keeps its attention; fused where it cannot run is refused naming why; a model never gets automatic.
TEST(GPT2, ChooseAttentionResolvesAutomatic) {
  GPT2 model(micro());
  EXPECT_EQ(choose_attention(model, AttentionKernel::automatic, Device::cpu, DType::f32), AttentionKernel::fused);
  EXPECT_EQ(choose_attention(model, AttentionKernel::blocks, Device::cpu, DType::bf16), AttentionKernel::blocks);
  std::string fallback = "stale";
  EXPECT_EQ(choose_attention(model, AttentionKernel::automatic, Device::cuda, DType::f32, &fallback),
            AttentionKernel::blocks);
  EXPECT_EQ(fallback, "") << "fp32 on cuda keeps blocks by design, without a line";
  try {
    choose_attention(model, AttentionKernel::fused, Device::cuda, DType::f32);
    ADD_FAILURE() << "fused fp32 on cuda was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("attention"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model.set_attention(AttentionKernel::automatic), Error);
  // A bf16 run on a GPU that keeps blocks (no CUDA path here, or no cuDNN) says why, for its one line.
  if (const std::string why = ops::fused_attention_unavailable(Device::cuda, DType::bf16); !why.empty()) {
    EXPECT_EQ(choose_attention(model, AttentionKernel::automatic, Device::cuda, DType::bf16, &fallback),
              AttentionKernel::blocks);
    EXPECT_EQ(fallback, why);
  }

  // A model of one's own: the base class's set_attention.
  struct Own final : Model {
    std::vector<UnitSpec> units() const override { return {}; }
    void init_unit(int, const UnitTensors&, uint64_t) const override {}
    double forward_backward(ParamContext&, const Batch&, float) override { return 0; }
    double forward(ParamContext&, const Batch&) override { return 0; }
    int64_t activation_bytes(int, int, DType) const override { return 0; }
    int vocab_size() const override { return 1; }
    int context_length() const override { return 1; }
  } own;
  EXPECT_EQ(choose_attention(own, AttentionKernel::automatic, Device::cpu, DType::f32), AttentionKernel::blocks);
  EXPECT_THROW(choose_attention(own, AttentionKernel::fused, Device::cpu, DType::f32), UsageError);
}

TEST(GPT2, BadBatchesFailBeforeAnyGather) {
  const GPT2Config tiny = gpt2_config("tiny");
  GPT2 model(tiny);
  LocalParams ctx(model, DType::f32);
  const auto expect_error = [&](test::RandomTokens data, const std::string& part) {
    const std::string msg = error_of([&] { model.forward_backward(ctx, data.batch(), 1.0f); });
    EXPECT_TRUE(contains(msg, part)) << msg;
    EXPECT_EQ(msg.rfind("GPT-2 batch: ", 0), 0u) << msg;  // the caller's input, named from the model on
    EXPECT_THROW(model.forward_backward(ctx, data.batch(), 1.0f), UsageError);
    EXPECT_TRUE(ctx.events().empty());
  };
  test::RandomTokens big_input(2, 8, tiny.vocab, 18);
  big_input.inputs[5] = tiny.vocab;
  expect_error(big_input, "input token 256 at position 5 is outside the vocabulary [0, 256)");
  test::RandomTokens negative_target(2, 8, tiny.vocab, 18);
  negative_target.targets[0] = -1;
  expect_error(negative_target, "target token -1");
  expect_error(test::RandomTokens(1, tiny.ctx + 1, tiny.vocab, 18), "exceeds the context 128");
  expect_error(test::RandomTokens(0, 8, tiny.vocab, 18), "B and T must be positive");
}

}  // namespace
}  // namespace zshard
