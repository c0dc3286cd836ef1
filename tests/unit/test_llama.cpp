// The Llama model on one process: its named sizes against the published parameter counts, Hugging Face
// names, its forward against a plain-loop transcription of LlamaForCausalLM, every gradient against
// finite differences in double (tied and untied heads, fewer KV heads than query heads), f32 against f64,
// its activation bytes against the allocator, and a tied head's weight gradient deferred to the
// embedding's backward against it added at the head.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include <zshard/model_registry.h>
#include <zshard/testing.h>

#include "kernels/allocator.h"
#include "models/llama.h"
#include "tests/support/model_checks.h"
#include "tests/support/test_support.h"

namespace zshard {
namespace {

using test::max_rel_diff;
using Vec = std::vector<double>;

// Small enough to finite-difference every parameter element: 4 query heads sharing 2 KV heads.
LlamaConfig micro(bool tied) { return {2, 8, 4, 2, 12, 11, 8, 10000, tied, {}, {}}; }

// Hugging Face's inverse frequencies (_compute_default_rope_parameters, and _compute_llama3_parameters
// where the config rescales), transcribed.
double hf_inv_freq(const LlamaConfig& c, int j, int hs) {
  const double inv_freq = 1.0 / std::pow(c.rope_theta, 2.0 * j / hs);
  const ops::RopeScaling& s = c.rope_scaling;
  if (s.factor == 0) return inv_freq;
  const double low_freq_wavelen = s.original_ctx / s.low_freq_factor;
  const double high_freq_wavelen = s.original_ctx / s.high_freq_factor;
  const double wavelen = 2 * M_PI / inv_freq;
  const double llama = wavelen > low_freq_wavelen ? inv_freq / s.factor : inv_freq;
  const double smooth_factor = (s.original_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  const double smoothed = (1 - smooth_factor) * llama / s.factor + smooth_factor * llama;
  const bool is_medium_freq = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
  return is_medium_freq ? smoothed : llama;
}

// Hugging Face's LlamaForCausalLM forward transcribed into plain loops in double, sharing no code with the
// model: the sum of the token losses.
double reference_loss(const LlamaConfig& c, const LocalParams& ctx, const test::RandomTokens& data) {
  const int T = data.T, C = c.dim, NH = c.heads, NKV = c.kv_heads, hs = C / NH, KV = NKV * hs, F = c.ffn_dim;
  const auto param = [&](int unit, int i) { return to_doubles(ctx.param_tensors(unit)[i]); };
  const auto rmsnorm = [&](const Vec& x, const Vec& w) {
    Vec out(x.size());
    for (int t = 0; t < T; ++t) {
      double ms = 0;
      for (int i = 0; i < C; ++i) ms += x[t * C + i] * x[t * C + i] / C;
      for (int i = 0; i < C; ++i) out[t * C + i] = x[t * C + i] / std::sqrt(ms + 1e-5) * w[i];
    }
    return out;
  };
  const auto linear = [&](const Vec& x, int in, const Vec& w, int out_dim) {  // x @ w^T, w (out, in)
    Vec out(size_t(T) * out_dim, 0.0);
    for (int t = 0; t < T; ++t)
      for (int o = 0; o < out_dim; ++o)
        for (int i = 0; i < in; ++i) out[t * out_dim + o] += x[t * in + i] * w[o * in + i];
    return out;
  };
  const auto rope = [&](Vec& x, int heads) {  // rotate_half: q*cos + rotate_half(q)*sin
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < heads; ++h) {
        double* v = &x[(t * heads + h) * hs];
        Vec out(hs);
        for (int i = 0; i < hs; ++i) {
          const int j = i % (hs / 2);
          const double angle = t * hf_inv_freq(c, j, hs);
          const double rotated = i < hs / 2 ? -v[i + hs / 2] : v[i - hs / 2];
          out[i] = v[i] * std::cos(angle) + rotated * std::sin(angle);
        }
        std::copy(out.begin(), out.end(), v);
      }
  };
  const Vec embed = param(0, 0);
  const Vec head = c.tie_embeddings ? embed : param(c.layers + 1, 1);
  double total = 0;
  for (int b = 0; b < data.B; ++b) {
    const int32_t* tokens = data.inputs.data() + b * T;
    Vec x(size_t(T) * C);
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < C; ++i) x[t * C + i] = embed[tokens[t] * C + i];
    for (int l = 0; l < c.layers; ++l) {
      const auto p = [&](int i) { return param(1 + l, i); };
      const Vec h1 = rmsnorm(x, p(0));
      Vec q = linear(h1, C, p(1), C), k = linear(h1, C, p(2), KV);
      const Vec v = linear(h1, C, p(3), KV);
      rope(q, NH);
      rope(k, NKV);
      Vec y(size_t(T) * C, 0.0);
      for (int h = 0; h < NH; ++h) {
        const int kh = h / (NH / NKV);
        for (int t = 0; t < T; ++t) {
          Vec score(t + 1);
          double max_score = -1e300, norm = 0;
          for (int s = 0; s <= t; ++s) {
            double dot = 0;
            for (int d = 0; d < hs; ++d) dot += q[t * C + h * hs + d] * k[s * KV + kh * hs + d];
            max_score = std::max(max_score, score[s] = dot / std::sqrt(double(hs)));
          }
          for (double& s : score) norm += (s = std::exp(s - max_score));
          for (int s = 0; s <= t; ++s)
            for (int d = 0; d < hs; ++d) y[t * C + h * hs + d] += score[s] / norm * v[s * KV + kh * hs + d];
        }
      }
      const Vec attn = linear(y, C, p(4), C);
      for (size_t i = 0; i < x.size(); ++i) x[i] += attn[i];
      const Vec h2 = rmsnorm(x, p(5));
      const Vec gate = linear(h2, C, p(6), F), up = linear(h2, C, p(7), F);
      Vec act(gate.size());
      for (size_t i = 0; i < act.size(); ++i) act[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i];
      const Vec mlp = linear(act, F, p(8), C);
      for (size_t i = 0; i < x.size(); ++i) x[i] += mlp[i];
    }
    const Vec logits = linear(rmsnorm(x, param(c.layers + 1, 0)), C, head, c.vocab);
    for (int t = 0; t < T; ++t) {
      double max_logit = -1e300, norm = 0;
      for (int v = 0; v < c.vocab; ++v) max_logit = std::max(max_logit, logits[t * c.vocab + v]);
      for (int v = 0; v < c.vocab; ++v) norm += std::exp(logits[t * c.vocab + v] - max_logit);
      total += max_logit + std::log(norm) - logits[t * c.vocab + data.targets[b * T + t]];
    }
  }
  return total;
}

TEST(LlamaConfig, NamedSizesHaveThePublishedParameterCounts) {
  EXPECT_EQ(llama_config("tinyllama-1.1b").num_params(), 1'100'048'384);
  EXPECT_EQ(llama_config("llama-3.2-1b").num_params(), 1'235'814'400);
  for (const char* name : {"llama-tiny", "tinyllama-1.1b", "llama-3.2-1b"}) {
    const std::unique_ptr<Model> model = build_model(name, model_config(name));
    EXPECT_EQ(num_params(*model), llama_config(name).num_params()) << name;
  }
  EXPECT_THAT(test::error_of([] { build_model("llama-tiny", model_config("llama-tiny", {{"kv_heads", 3}})); }),
              ::testing::HasSubstr("heads 4 is not divisible by kv_heads 3"));
}

// 6 FLOPs per parameter and the attention's 6 * layers * T * dim. Tied, the embedding's matrix is the
// head's: one matmul, counted once (as GPT-2's); a lookup is no matmul.
TEST(Llama, FlopsCountEachMatrixOnce) {
  for (const bool tied : {true, false}) {
    LlamaConfig config = llama_config("llama-3.2-1b");
    config.tie_embeddings = tied;
    const Llama model(config);
    const double attention = 6.0 * config.layers * 1024.0 * config.dim;
    EXPECT_DOUBLE_EQ(model.flops_per_token(1024), 6.0 * double(num_params(model)) + attention) << tied;
  }
}

TEST(Llama, UnitsCarryHuggingFaceNames) {
  for (bool tied : {false, true}) {
    const std::vector<UnitSpec> units = Llama(micro(tied)).units();
    ASSERT_EQ(units.size(), 4u);
    EXPECT_EQ(units[0].params[0].name, "model.embed_tokens.weight");
    EXPECT_EQ(units[1].params[2].name, "model.layers.0.self_attn.k_proj.weight");
    EXPECT_EQ(units[1].params[2].shape, (Shape{4, 8}));  // 2 KV heads of 2
    EXPECT_EQ(units[2].params[8].name, "model.layers.1.mlp.down_proj.weight");
    EXPECT_EQ(units[3].params.size(), tied ? 1u : 2u);
    EXPECT_FALSE(units[1].params[0].weight_decay);  // RMSNorm gains are not decayed
    EXPECT_TRUE(units[1].params[1].weight_decay);
  }
}

TEST(Llama, ForwardEqualsHuggingFaceTranscription) {
  for (bool tied : {false, true}) {
    Llama model(micro(tied));
    LocalParams ctx(model, DType::f64);
    test::randomize_params(ctx, 0.4, tied ? 21 : 22);
    const test::RandomTokens data(2, 7, micro(tied).vocab, 23);
    EXPECT_NEAR(model.forward(ctx, data.batch()), reference_loss(micro(tied), ctx, data), 1e-10) << tied;
  }
}

// Rescaled rotary frequencies (Llama 3's rule) at head size 8, theta 10000: wavelengths 6.3 and 63 kept
// (under 1000 / 4), 628 interpolated, 6283 stretched by the factor.
TEST(Llama, ScaledRopeForwardEqualsHuggingFaceTranscription) {
  LlamaConfig scaled = micro(false);
  scaled.heads = scaled.kv_heads = 1;
  scaled.rope_scaling = {8, 1, 4, 1000};
  Llama model(scaled);
  LocalParams ctx(model, DType::f64);
  test::randomize_params(ctx, 0.4, 26);
  const test::RandomTokens data(2, 7, scaled.vocab, 27);
  EXPECT_NEAR(model.forward(ctx, data.batch()), reference_loss(scaled, ctx, data), 1e-10);
  scaled.rope_scaling = {};
  EXPECT_GT(std::abs(model.forward(ctx, data.batch()) - reference_loss(scaled, ctx, data)), 1e-6)
      << "the rescaling moves the loss";
}

// Llama 3.2-1B's config carries its rope_scaling; the other sizes carry no such key (their checkpoints'
// configurations are what they were), and naming one adds the four, checked.
TEST(LlamaConfig, RopeScalingKeys) {
  const ops::RopeScaling s = llama_config("llama-3.2-1b").rope_scaling;
  EXPECT_EQ(s.factor, 32);
  EXPECT_EQ(s.original_ctx, 8192);
  EXPECT_EQ(llama_config_from(model_config("llama-3.2-1b")).rope_scaling.high_freq_factor, 4);
  EXPECT_FALSE(model_config("llama-tiny").count("rope_scaling_factor"));
  // Turned off, the keys go: the configuration (and a checkpoint's) is the plain one again.
  ModelConfig plain = model_config("llama-3.2-1b");
  for (const char* key : kRopeScalingKeys) plain.erase(key);
  EXPECT_EQ(model_config("llama-3.2-1b", {{"rope_scaling_factor", 0}}), plain);
  EXPECT_EQ(model_config("llama-tiny", {{"rope_scaling_factor", 0}}), model_config("llama-tiny"));
  const ModelConfig rescaled = model_config("llama-tiny", {{"rope_scaling_factor", 8}});
  EXPECT_EQ(rescaled.at("rope_original_ctx").integer(), 8192);
  EXPECT_EQ(llama_config_from(rescaled).rope_scaling.factor, 8);
  EXPECT_THAT(test::error_of([] {
                build_model("llama-tiny", model_config("llama-tiny", {{"rope_scaling_factor", 8}, {"rope_high_freq_factor", 1}}));
              }),
              ::testing::HasSubstr("rope_high_freq_factor must exceed rope_low_freq_factor"));
  EXPECT_THAT(test::error_of([] { build_model("llama-tiny", model_config("llama-tiny", {{"rope_low_freq_factor", 2}})); }),
              ::testing::HasSubstr("rescale nothing without rope_scaling_factor"));
}

// Tied, both timings of the head's weight gradient: 10 tokens are not fewer than the 8 channels (at the
// head), 5 are (deferred to the embedding's backward).
TEST(Llama, EveryGradientMatchesFiniteDifferencesInDouble) {
  for (const auto [tied, B] : {std::pair{false, 2}, std::pair{true, 2}, std::pair{true, 1}}) {
    SCOPED_TRACE(tied ? (B == 1 ? "tied head, deferred" : "tied head") : "untied head");
    Llama model(micro(tied));
    ASSERT_EQ(model.defers_head_gradient(B, 5), tied && B == 1);
    LocalParams ctx(model, DType::f64);
    test::randomize_params(ctx, 0.4, 24);
    const test::RandomTokens data(B, 5, micro(tied).vocab, 25);
    test::expect_gradients_match_finite_differences(model, ctx, data);
  }
}

TEST(Llama, FloatMatchesDouble) {
  const LlamaConfig tiny = llama_config("llama-tiny");
  Llama model(tiny);
  LocalParams ctx64(model, DType::f64), ctx32(model, DType::f32);
  ctx64.init(model, 26);
  ctx32.copy_params_from(ctx64);
  const test::RandomTokens data(2, 32, tiny.vocab, 27);
  const double loss64 = model.forward_backward(ctx64, data.batch(), 1.0f);
  const double loss32 = model.forward_backward(ctx32, data.batch(), 1.0f);
  EXPECT_NEAR(loss32, loss64, 1e-5 * loss64);
  EXPECT_NEAR(loss64 / (data.B * data.T), std::log(double(tiny.vocab)), 0.1);  // init: about uniform
  for (int u = 0; u < ctx64.num_units(); ++u)
    for (size_t i = 0; i < ctx64.grad_tensors(u).size(); ++i)
      EXPECT_LE(max_rel_diff(to_doubles(ctx32.grad_tensors(u)[i]), to_doubles(ctx64.grad_tensors(u)[i])), 1e-4)
          << u << "." << i;
}

// Untied and tied, the tied head's weight gradient deferred (32 and 21 tokens of 64 channels) or not (64),
// with and without checkpointing.
TEST(Llama, ActivationBytesMatchTheAllocator) {
  const auto live = [] { return Allocator::of(Device::cpu).stats().live[int(Category::activations)]; };
  const int64_t before = live();
  for (bool tied : {false, true}) {
    LlamaConfig tiny = llama_config("llama-tiny");
    tiny.tie_embeddings = tied;
    Llama model(tiny);
    LocalParams ctx(model, DType::f32);
    ctx.init(model, 28);
    for (Recompute mode : {Recompute::none, Recompute::blocks}) {
      model.set_recompute(mode);
      for (auto [B, T] : {std::pair{2, 16}, std::pair{3, 7}, std::pair{4, 16}}) {
        SCOPED_TRACE(testing::Message() << (tied ? "tied " : "untied ") << B << "x" << T << " mode " << int(mode));
        EXPECT_EQ(model.defers_head_gradient(B, T), tied && B * T < tiny.dim);
        const test::RandomTokens data(B, T, tiny.vocab, 29);
        model.forward_backward(ctx, data.batch(), 1.0f);
        EXPECT_EQ(live() - before, model.activation_bytes(B, T, DType::f32));
      }
    }
  }
  EXPECT_EQ(live(), before);
}

// Deferring gives the dlogits bytes of their own instead of sharing the layer scratch's: the activations
// grow by the smaller of the two (llama-tiny's 256-token vocabulary makes it the logits).
TEST(Llama, DeferredHeadAddsTheSmallerOfLogitsAndLayerScratch) {
  LlamaConfig tiny = llama_config("llama-tiny");
  tiny.tie_embeddings = true;
  Llama model(tiny);
  const int B = 1, T = 32, N = B * T;
  model.set_head_gradient(HeadGradient::immediate);
  const int64_t at_head = model.activation_bytes(B, T, DType::f32);
  model.set_head_gradient(HeadGradient::deferred);
  const int64_t deferred = model.activation_bytes(B, T, DType::f32);
  model.set_head_gradient(HeadGradient::by_tokens);
  const int64_t C = tiny.dim, KV = tiny.kv_dim(), F = tiny.ffn_dim;
  // proj q dq datty, k v dk dv, dqkv, dswiglu dgate dup; every buffer a multiple of 64 elements here.
  const int64_t scratch = N * (4 * C + 4 * KV + 3 * C + 3 * F), logits = N * logits_row_stride(tiny.vocab);
  ASSERT_LT(logits, scratch);
  EXPECT_EQ(deferred - at_head, logits * 4);
  EXPECT_EQ(model.activation_bytes(B, T, DType::f32), deferred);
}

// The tied head's weight gradient added at the head or deferred to the embedding's backward: the same
// losses and gradient bits over two accumulated micro-steps, with and without checkpointing, in f32 and f64.
TEST(Llama, DeferredHeadGradientGivesTheSameBits) {
  LlamaConfig config = llama_config("llama-tiny");
  config.layers = 4;
  config.tie_embeddings = true;
  Llama model(config);
  LocalParams params(model, DType::f64);
  test::randomize_params(params, 0.1, 33);
  test::expect_deferred_head_bit_identical(
      model, [&](HeadGradient when) { model.set_head_gradient(when); }, params, {2, 24, config.vocab, 34});
}

// A tied head's weight gradient waits for the embedding's backward when the micro-batch has fewer tokens
// than channels, so unit 0's gradients open after every other unit's are ready; an untied Llama never
// defers (its head is in the final unit).
TEST(Llama, TiedGradientOpensAtTheEmbeddingWithFewerTokensThanChannels) {
  LlamaConfig tiny = llama_config("llama-tiny");  // 64 channels
  tiny.tie_embeddings = true;
  Llama model(tiny);
  for (const auto [B, deferred] : {std::pair{2, true}, std::pair{4, false}}) {  // 32 and 64 tokens of 16
    SCOPED_TRACE(B);
    EXPECT_EQ(model.defers_head_gradient(B, 16), deferred);
    EXPECT_EQ(model.keeps_gradients_open(B, 16), !deferred);
    test::expect_tied_gradient_opens(model, {B, 16, tiny.vocab, 35}, deferred);
  }
  tiny.tie_embeddings = false;
  Llama untied(tiny);
  untied.set_head_gradient(HeadGradient::deferred);
  EXPECT_FALSE(untied.defers_head_gradient(1, 1));
  EXPECT_FALSE(untied.keeps_gradients_open(1, 1));
}

TEST(Llama, CheckpointingGivesTheSameBits) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied head" : "untied head");
    LlamaConfig config = llama_config("llama-tiny");
    config.layers = 6;  // every layer's forward and recompute reuse the one slot
    config.tie_embeddings = tied;
    Llama model(config);
    LocalParams params(model, DType::f64);
    test::randomize_params(params, 0.1, 30);
    const test::RandomTokens data(2, 24, config.vocab, 31);
    for (DType dtype : {DType::f32, DType::f64}) {
      SCOPED_TRACE(dtype_name(dtype));
      test::expect_recompute_bit_identical(model, params, dtype, data);
    }
  }
}

TEST(Llama, CheckpointingShrinksActivationsAsAllocated) {
  LlamaConfig tiny = llama_config("llama-tiny");
  tiny.layers = 6;
  Llama model(tiny);
  const auto [none, blocks] = test::expect_recompute_shrinks_activations(model, {2, 32, tiny.vocab, 32});
  EXPECT_LT(blocks * 2, none);
}

// Fused attention over the packed grouped-query heads: the same losses and gradients as blocks but for
// rounding (f64 to 1e-12, f32 to 1e-5), the same protocol, fewer activation bytes. T = 70 crosses the CPU
// kernel's row blocks.
TEST(Llama, FusedAttentionMatchesBlocks) {
  const LlamaConfig tiny = llama_config("llama-tiny");
  for (const auto [dtype, tol] : {std::pair{DType::f64, 1e-12}, std::pair{DType::f32, 1e-5}}) {
    SCOPED_TRACE(dtype_name(dtype));
    Llama model(tiny);
    LocalParams params(model, DType::f64);
    test::randomize_params(params, 0.1, 33);
    test::expect_fused_attention_matches_blocks(model, params, dtype, {2, 70, tiny.vocab, 34}, tol);
  }
}

TEST(Llama, FusedAttentionGradientsMatchFiniteDifferencesInDouble) {
  Llama model(micro(false));
  model.set_attention(AttentionKernel::fused);
  LocalParams ctx(model, DType::f64);
  test::randomize_params(ctx, 0.3, 35);
  test::expect_gradients_match_finite_differences(model, ctx, {2, 5, micro(false).vocab, 36});
}

}  // namespace
}  // namespace zshard
