// Frozen parameters and LoRA adapters in the GPT-2 and Llama models: the adapters' parameters (names,
// shapes, init), their gradients and the input gradients through the frozen layers against finite
// differences, no gradient for a frozen parameter, a LoRA model starting as its base, merged weights computing
// what the adapted model does, recomputation and the activation bytes with adapters, the settings in the
// configuration and the bad ones refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

#include <zshard/model_registry.h>
#include <zshard/testing.h>

#include "models/config_json.h"
#include "models/gpt2.h"
#include "models/llama.h"
#include "tests/support/model_checks.h"
#include "tests/support/test_support.h"

namespace zshard {
namespace {

using ::testing::HasSubstr;
using test::error_of;

// Small enough to finite-difference every adapter element; rank 2 below every layer's sizes.
GPT2Config micro_gpt2(LoraSettings lora = {}) { return {2, 8, 2, 11, 8, lora}; }
LlamaConfig micro_llama(bool tied, LoraSettings lora = {}) { return {2, 8, 4, 2, 12, 11, 8, 10000, tied, lora}; }
const LoraSettings kAllGPT2{2, 6, "c_attn,c_proj,c_fc"};
const LoraSettings kAllLlama{2, 6, "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"};

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::abs(v));
  return m;
}

// The parameters a model trains: the adapters with LoRA, each named ".lora_A.weight" or ".lora_B.weight".
std::vector<std::string> trained(const Model& model) {
  std::vector<std::string> names;
  for (const UnitSpec& unit : model.units())
    for (const ParamSpec& p : unit.params)
      if (!p.frozen) names.push_back(p.name);
  return names;
}

// Every adapter's gradient and, through them, the input gradients of every frozen layer above it: an
// adapter of block 0 is only right when what reaches it through block 1 is. B random (not PEFT's zero start),
// so that A's gradients are not zero. Frozen parameters get no gradient: their entries stay undefined.
void expect_adapter_gradients_match_finite_differences(Model& model, int vocab, int B) {
  LocalParams ctx(model, DType::f64);
  test::randomize_params(ctx, 0.4, 31);
  const test::RandomTokens data(B, 5, vocab, 32);
  test::expect_gradients_match_finite_differences(model, ctx, data);
  const std::vector<UnitSpec> units = model.units();
  for (int u = 0; u < ctx.num_units(); ++u)
    for (size_t i = 0; i < units[u].params.size(); ++i) {
      const ParamSpec& p = units[u].params[i];
      EXPECT_EQ(ctx.grad_tensors(u)[i].defined(), !p.frozen) << p.name;
      if (!p.frozen) EXPECT_GT(max_abs(to_doubles(ctx.grad_tensors(u)[i])), 0.0) << p.name;
    }
}

TEST(LoraModel, GPT2AdaptersSitInTheirBlockAfterItsParamsAndFreezeTheRest) {
  const GPT2 model(micro_gpt2({2, 8, "c_proj"}));  // PEFT's suffix match: both c_proj layers
  const std::vector<UnitSpec> units = model.units();
  ASSERT_EQ(units[1].params.size(), 16u);
  const auto expect = [&](size_t i, const std::string& name, Shape shape) {
    EXPECT_EQ(units[1].params[i].name, name);
    EXPECT_EQ(units[1].params[i].shape, shape) << name;
    EXPECT_TRUE(units[1].params[i].weight_decay) << name;
    EXPECT_FALSE(units[1].params[i].frozen) << name;
  };
  expect(12, "h.0.attn.c_proj.lora_A.weight", {2, 8});
  expect(13, "h.0.attn.c_proj.lora_B.weight", {8, 2});
  expect(14, "h.0.mlp.c_proj.lora_A.weight", {2, 32});
  expect(15, "h.0.mlp.c_proj.lora_B.weight", {8, 2});
  EXPECT_EQ(trained(model).size(), 8u);  // 4 adapters, 2 blocks
  EXPECT_EQ(GPT2(micro_gpt2({2, 8, "attn.c_proj"})).units()[1].params.size(), 14u);
  for (const UnitSpec& unit : GPT2(micro_gpt2()).units())
    for (const ParamSpec& p : unit.params) EXPECT_FALSE(p.frozen) << p.name;
}

TEST(LoraModel, LlamaAdaptersUseTheModelsNames) {
  const Llama model(micro_llama(false, {2, 8, "q_proj,down_proj"}));
  const std::vector<UnitSpec> units = model.units();
  ASSERT_EQ(units[2].params.size(), 13u);
  EXPECT_EQ(units[2].params[9].name, "model.layers.1.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(units[2].params[9].shape, (Shape{2, 8}));
  EXPECT_EQ(units[2].params[12].name, "model.layers.1.mlp.down_proj.lora_B.weight");
  EXPECT_EQ(units[2].params[12].shape, (Shape{8, 2}));
  EXPECT_EQ(trained(model).size(), 8u);
  EXPECT_TRUE(units[3].params[1].frozen) << units[3].params[1].name;  // the untied head
}

TEST(LoraModel, GPT2GradientsMatchFiniteDifferences) {
  GPT2 model(micro_gpt2(kAllGPT2));
  for (const auto when : {HeadGradient::immediate, HeadGradient::deferred}) {
    model.set_head_gradient(when);
    expect_adapter_gradients_match_finite_differences(model, 11, 2);
  }
}

TEST(LoraModel, LlamaGradientsMatchFiniteDifferences) {
  for (const bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    Llama model(micro_llama(tied, kAllLlama));
    expect_adapter_gradients_match_finite_differences(model, 11, 1);
  }
}

// Frozen parameters without LoRA, as an engine may freeze them: the embedding tables (tied into GPT-2's head),
// norms, a bias and whole matrices. Every other gradient still matches, so each op's input gradient does.
TEST(LoraModel, FrozenParametersGetNoGradientAndTheOthersStayRight) {
  GPT2 gpt2(micro_gpt2());
  for (const auto when : {HeadGradient::immediate, HeadGradient::deferred}) {
    gpt2.set_head_gradient(when);
    LocalParams ctx(gpt2, DType::f64, Device::cpu,
                    {"wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.attn.c_attn.weight", "h.1.mlp.c_fc.bias",
                     "h.1.ln_2.bias", "ln_f.weight", "ln_f.bias"});
    test::randomize_params(ctx, 0.4, 33);
    test::expect_gradients_match_finite_differences(gpt2, ctx, test::RandomTokens(2, 5, 11, 34));
    EXPECT_FALSE(ctx.grad_tensors(0)[0].defined());
  }
  for (const bool tied : {false, true}) {
    Llama llama(micro_llama(tied));
    std::vector<std::string> frozen = {"model.embed_tokens.weight", "model.layers.0.self_attn.k_proj.weight",
                                       "model.layers.1.mlp.down_proj.weight", "model.layers.1.input_layernorm.weight",
                                       "model.norm.weight"};
    if (!tied) frozen.push_back("lm_head.weight");
    LocalParams ctx(llama, DType::f64, Device::cpu, frozen);
    test::randomize_params(ctx, 0.4, 35);
    test::expect_gradients_match_finite_differences(llama, ctx, test::RandomTokens(2, 5, 11, 36));
  }
}

// B starts at zero, so the adapted model computes its base's loss to the bit; the base's parameters take
// the same values with adapters as without (the adapters have random streams of their own), and A is
// PEFT's Kaiming-uniform, within 1/sqrt(in).
TEST(LoraModel, AdaptedModelStartsAsItsBase) {
  const auto check = [](Model& base, Model& adapted, int vocab) {
    LocalParams base_ctx(base, DType::f32), adapted_ctx(adapted, DType::f32);
    base_ctx.init(base, 41);
    adapted_ctx.init(adapted, 41);
    const std::vector<UnitSpec> units = adapted.units();
    for (int u = 0; u < base_ctx.num_units(); ++u)
      for (size_t i = 0; i < units[u].params.size(); ++i) {
        const std::vector<double> values = to_doubles(adapted_ctx.param_tensors(u)[i]);
        const std::string& name = units[u].params[i].name;
        if (i < base_ctx.param_tensors(u).size()) {
          EXPECT_EQ(values, to_doubles(base_ctx.param_tensors(u)[i])) << name;
        } else if (name.ends_with("lora_B.weight")) {
          EXPECT_EQ(max_abs(values), 0.0) << name;
        } else {
          const double bound = 1 / std::sqrt(double(units[u].params[i].shape[1]));
          EXPECT_LE(max_abs(values), bound) << name;
          EXPECT_GT(max_abs(values), 0.8 * bound) << name;
        }
      }
    const test::RandomTokens data(2, 6, vocab, 42);
    const double base_loss = base.forward_backward(base_ctx, data.batch(), 1.0f);
    const double adapted_loss = adapted.forward_backward(adapted_ctx, data.batch(), 1.0f);
    EXPECT_EQ(std::memcmp(&base_loss, &adapted_loss, sizeof(double)), 0) << base_loss << " vs " << adapted_loss;
  };
  GPT2 gpt2(micro_gpt2()), gpt2_lora(micro_gpt2(kAllGPT2));
  check(gpt2, gpt2_lora, 11);
  Llama llama(micro_llama(true)), llama_lora(micro_llama(true, kAllLlama));
  check(llama, llama_lora, 11);
}

// Merged, the adapters leave the model without LoRA computing what the adapted model computes, for every
// layer of both layouts: square ones too, where a delta transposed the wrong way would fit the shape.
TEST(LoraModel, MergedWeightsComputeWhatTheAdaptedModelComputes) {
  const auto check = [](Model& base, Model& adapted, const LoraPlan& lora, int vocab) {
    LocalParams base_ctx(base, DType::f64), adapted_ctx(adapted, DType::f64);
    test::randomize_params(adapted_ctx, 0.4, 51);  // B too, so that the adapters change the loss
    const std::vector<UnitSpec> units = adapted.units();
    std::vector<NamedWeight> weights;
    for (int u = 0; u < adapted_ctx.num_units(); ++u)
      for (size_t i = 0; i < units[u].params.size(); ++i) {
        std::vector<double> values = to_doubles(adapted_ctx.param_tensors(u)[i]);
        for (double& v : values) v = float(v);  // what a weights file holds
        assign_doubles(adapted_ctx.param_tensors(u)[i], values);
        weights.push_back({units[u].params[i].name, units[u].params[i].shape, {values.begin(), values.end()}});
      }
    lora.merge(weights);
    const std::vector<UnitSpec> base_units = base.units();
    size_t next = 0;
    for (int u = 0; u < base_ctx.num_units(); ++u)
      for (size_t i = 0; i < base_units[u].params.size(); ++i, ++next) {
        ASSERT_EQ(weights.at(next).name, base_units[u].params[i].name);
        assign_doubles(base_ctx.param_tensors(u)[i], {weights[next].values.begin(), weights[next].values.end()});
      }
    EXPECT_EQ(next, weights.size());
    const test::RandomTokens data(2, 6, vocab, 52);
    const double merged = base.forward(base_ctx, data.batch()), expected = adapted.forward(adapted_ctx, data.batch());
    EXPECT_NEAR(merged, expected, 1e-5 * std::abs(expected));
  };
  GPT2 gpt2(micro_gpt2()), gpt2_lora(micro_gpt2(kAllGPT2));
  check(gpt2, gpt2_lora, gpt2_lora.lora_plan(), 11);
  Llama llama(micro_llama(false)), llama_lora(micro_llama(false, kAllLlama));
  check(llama, llama_lora, llama_lora.lora_plan(), 11);
}

// Each adapter's saved hidden is an activation: counted by activation_bytes (the allocator agrees), kept
// per block or, recomputed, rebuilt inside the block's backward with the same bits.
TEST(LoraModel, RecomputeAndActivationBytesCoverTheAdapters) {
  GPT2 gpt2(micro_gpt2(kAllGPT2)), base(micro_gpt2());
  LocalParams params(gpt2, DType::f64);
  test::randomize_params(params, 0.4, 43);
  const test::RandomTokens data(2, 5, 11, 44);
  test::expect_recompute_bit_identical(gpt2, params, DType::f32, data);
  GPT2 fresh(micro_gpt2(kAllGPT2));  // no activations held yet, so that the allocator's count is its own
  const int64_t none = test::expect_recompute_shrinks_activations(fresh, data).first;
  // Four (L, B, T, R) hiddens, each rounded up to 64 elements of 4 bytes.
  EXPECT_EQ(none - base.activation_bytes(2, 5, DType::f32), 4 * 64 * 4);

  Llama llama(micro_llama(false, kAllLlama));
  LocalParams llama_params(llama, DType::f64);
  test::randomize_params(llama_params, 0.4, 45);
  test::expect_recompute_bit_identical(llama, llama_params, DType::f32, data);
  Llama fresh_llama(micro_llama(false, kAllLlama));
  test::expect_recompute_shrinks_activations(fresh_llama, data);
}

// The adapters' matmuls count 6 FLOPs per parameter; a frozen matrix 4, its weight gradient skipped.
TEST(LoraModel, FlopsCountTheAdaptersAndTheFrozenBase) {
  const GPT2 base(micro_gpt2()), adapted(micro_gpt2(kAllGPT2));
  const double adapters = double(num_params(adapted) - num_params(base));
  EXPECT_DOUBLE_EQ(adapted.flops_per_token(5), base.flops_per_token(5) - 2.0 * double(num_params(base)) + 6.0 * adapters);
}

TEST(LoraModel, SettingsTravelInTheConfiguration) {
  const ModelConfig config = model_config("tiny", {{"lora_rank", 4}, {"lora_targets", "c_fc,c_attn"}});
  EXPECT_EQ(config.at("lora_rank"), ConfigValue(4));
  EXPECT_EQ(config.at("lora_alpha"), ConfigValue(8.0));  // PEFT's default
  EXPECT_EQ(config.at("lora_targets"), ConfigValue("c_fc,c_attn"));
  const GPT2Config c = gpt2_config_from(config);
  EXPECT_EQ(c.lora.rank, 4);
  EXPECT_EQ(c.lora.targets, "c_fc,c_attn");
  EXPECT_EQ(to_model_config(c), config);
  EXPECT_EQ(nlohmann::json(config).get<ModelConfig>(), config);  // a checkpoint's record reads back
  EXPECT_EQ(nlohmann::json(config)["lora_targets"], "c_fc,c_attn");
  // Without LoRA the configuration holds no LoRA key; Llama's default targets are PEFT's.
  EXPECT_FALSE(model_config("tiny").count("lora_rank"));
  EXPECT_EQ(model_config("llama-tiny", {{"lora_rank", 2}}).at("lora_targets"), ConfigValue("q_proj,v_proj"));
  EXPECT_FALSE(ConfigValue("8") == ConfigValue(8));
}

TEST(LoraModel, BadSettingsAreRefusedNamingTheFlag) {
  const auto build = [](const std::string& name, const ModelConfig& overrides) {
    return error_of([&] { build_model(name, model_config(name, overrides)); });
  };
  EXPECT_EQ(build("tiny", {{"lora_rank", 4}, {"lora_targets", "c_attn,q_proj"}}),
            "--lora-targets: GPT-2 has no layer 'q_proj' (valid: c_attn, c_proj, c_fc, attn.c_attn, attn.c_proj, "
            "mlp.c_fc, mlp.c_proj)");
  EXPECT_THAT(build("llama-tiny", {{"lora_rank", 4}, {"lora_targets", "c_attn"}}),
              HasSubstr("--lora-targets: Llama has no layer 'c_attn' (valid: q_proj, k_proj, v_proj, o_proj, gate_proj, "
                        "up_proj, down_proj, self_attn.q_proj,"));
  EXPECT_EQ(build("tiny", {{"lora_rank", 0}}), "--lora-rank must be at least 1 (the adapters' rank), got 0");
  EXPECT_EQ(build("tiny", {{"lora_alpha", 16}}), "--lora-rank must be at least 1 (the adapters' rank), got 0");
  EXPECT_EQ(build("tiny", {{"lora_rank", 65}}), "--lora-rank 65 is larger than GPT-2's attn.c_attn allows (64 in, 192 out)");
  // llama-tiny's k_proj is 64 in, 32 out: rank 33 fits q_proj, not k_proj.
  EXPECT_EQ(build("llama-tiny", {{"lora_rank", 33}, {"lora_targets", "q_proj"}}), "(no error)");
  EXPECT_EQ(build("llama-tiny", {{"lora_rank", 33}, {"lora_targets", "k_proj"}}),
            "--lora-rank 33 is larger than Llama's self_attn.k_proj allows (64 in, 32 out)");
  for (const double alpha : {0.0, -1.0, std::numeric_limits<double>::infinity()})
    EXPECT_THAT(build("tiny", {{"lora_rank", 4}, {"lora_alpha", alpha}}),
                HasSubstr("--lora-alpha must be a positive finite number, got "));
  EXPECT_EQ(build("tiny", {{"lora_rank", 4}, {"lora_targets", ""}}), "--lora-targets names no layer");
  EXPECT_EQ(build("tiny", {{"lora_rank", "four"}}), "--config: lora_rank of model 'tiny' is a number, got 'four'");
}

// A resume compares a checkpoint's targets with the flags' by the layers they name.
TEST(LoraModel, TargetsReadAsTheLayersTheyName) {
  const GPT2 model(micro_gpt2({2, 4, "c_proj"}));
  const auto targets = [&](const std::string& text) {
    return model.lora_plan().with_targeted_layers({{"lora_targets", text}, {"layers", 2}}).at("lora_targets").text();
  };
  EXPECT_EQ(targets("c_proj"), "attn.c_proj,mlp.c_proj");
  EXPECT_EQ(targets("mlp.c_proj,attn.c_proj,c_proj"), "attn.c_proj,mlp.c_proj");
  EXPECT_EQ(targets("c_attn,c_fc"), "attn.c_attn,mlp.c_fc");
  EXPECT_EQ(targets("q_proj,c_fc"), "mlp.c_fc,q_proj");  // a name of another model kept as written
  EXPECT_EQ(model.lora_plan().with_targeted_layers({{"layers", 2}}), (ModelConfig{{"layers", 2}}));
}

// PEFT's adapter_config.json beside loaded adapters: targets compared by the layers they name, whatever
// their spelling or order; another rank, alpha or set of layers, and PEFT's settings of another math than
// plain LoRA's, refused in one line naming the key.
TEST(LoraModel, PeftConfigOfOtherAdaptersIsRefused) {
  const Llama model(micro_llama(false, {2, 6, "q_proj,v_proj"}));
  const LoraPlan& lora = model.lora_plan();
  const auto error = [&](const nlohmann::json& config) {
    return error_of([&] { lora.check_peft_config(config, "dir/adapter_config.json"); });
  };
  const nlohmann::json same = {{"peft_type", "LORA"}, {"r", 2}, {"lora_alpha", 6}, {"bias", "none"},
                               {"target_modules", {"v_proj", "self_attn.q_proj", "q_proj"}},
                               {"use_rslora", false}, {"rank_pattern", nlohmann::json::object()},
                               {"layers_to_transform", nullptr}};
  EXPECT_EQ(error(same), "(no error)");
  nlohmann::json other = same;
  other["target_modules"] = {"q_proj"};
  EXPECT_THAT(error(other), HasSubstr("says target_modules q_proj, the run gives q_proj,v_proj"));
  other = same;
  other["r"] = 4;
  EXPECT_THAT(error(other), HasSubstr("says r 4, the run gives 2"));
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"use_rslora", true}, {"use_dora", true}, {"alpha_pattern", {{"q_proj", 12}}},
           {"layers_to_transform", {0}}, {"modules_to_save", {"lm_head"}}, {"bias", "all"}, {"peft_type", "IA3"}}) {
    other = same;
    other[key] = value;
    EXPECT_THAT(error(other), HasSubstr("dir/adapter_config.json says " + key + " " + value.dump())) << key;
    EXPECT_THAT(error(other), HasSubstr("zshard's adapters are plain LoRA")) << key;
  }
}

}  // namespace
}  // namespace zshard
