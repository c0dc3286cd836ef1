#include "kernels/option_names.h"

#include <array>
#include <atomic>

namespace zshard {

namespace {

struct Names {
  std::string_view api, flag;
};

// Indexed by Option, in its order.
constexpr std::array<Names, 28> kNames = {{
    {"StrategyOptions::kind", "--strategy"},
    {"StrategyOptions::shard_group", "--shard-group"},
    {"StrategyOptions::max_inflight", "--max-inflight"},
    {"StrategyOptions::reshard_after_forward", "--reshard-after-forward"},
    {"StrategyOptions::quantize_gathers", "--quantize-gathers"},
    {"StrategyOptions::quantize_reductions", "--quantize-reductions"},
    {"StrategyOptions::secondary_shard", "--secondary-shard"},
    {"Placement::device", "--device"},
    {"Placement::param_dtype", "--param-dtype"},
    {"Placement::reduce_dtype", "--reduce-dtype"},
    {"Placement::offload_optimizer", "--offload"},
    {"PlanOptions::comm", "--comm"},
    {"PlanOptions::comm_timeout_s", "--comm-timeout"},
    {"the model name", "--model"},
    {"the model's ModelConfig", "--config"},
    {"Model::set_recompute", "--activation-checkpointing"},
    {"Model::set_attention", "--attention"},
    {"the flight recorder's directory", "--trace-dir"},
    {"the global batch", "--batch"},
    {"EngineOptions::grad_accum", "--grad-accum"},
    {"the save mode", "--save-mode"},
    {"the set-up memory check", "--mem-check"},
    {"EngineOptions::freeze", "--freeze"},
    {"the model's lora_rank", "--lora-rank"},
    {"the model's lora_alpha", "--lora-alpha"},
    {"the model's lora_targets", "--lora-targets"},
    {"EngineOptions::cuda_graphs", "--cuda-graphs"},
    {"the ranks' uneven micro-batches", "--rank-batches"},
}};
static_assert(kNames.size() == size_t(Option::rank_batches) + 1, "a name for every Option");

// Set once by a tool's main before any thread starts; read by error paths.
std::atomic<OptionNaming> naming{OptionNaming::api};

bool flags_named() { return naming.load(std::memory_order_relaxed) == OptionNaming::flags; }

}  // namespace

std::string_view option_name(Option option) {
  const Names& names = kNames[size_t(option)];
  return flags_named() ? names.flag : names.api;
}

std::string option_setting(Option option, std::string_view flag_value, std::string_view api_value) {
  std::string text(option_name(option));
  if (flags_named()) return text.append(" ").append(flag_value);
  return text.append(" = ").append(api_value);
}

void set_option_naming(OptionNaming n) { naming.store(n, std::memory_order_relaxed); }

OptionNaming option_naming() { return naming.load(std::memory_order_relaxed); }

}  // namespace zshard
