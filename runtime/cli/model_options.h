// The model a run trains, and its flags: --model, --config and its shorthands, --init-from, --seed,
// --activation-checkpointing, --attention, --fused-epilogues.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include <zshard/model.h>
#include <zshard/model_registry.h>
#include <zshard/plan.h>

#include "runtime/cli/cli_fwd.h"

namespace zshard {

struct ModelOptions {
  std::string name = "tiny";  // a name of the model registry (<zshard/model_registry.h>)
  ModelConfig overrides;      // replace the named configuration's values (--config, --layers, --dim, ...)
  std::string init_from;      // safetensors with the model's parameter names (a base model's, with LoRA)
  std::string init_adapters;  // --init-from's second file: LoRA adapters, loaded over the first
  uint64_t seed = 1337;       // initial parameters, the same whatever the world
  // What the model keeps for backward; changes memory and compute, never the results.
  Recompute recompute = Recompute::none;
  // How it computes attention; changes memory and speed, the results by rounding only.
  AttentionKernel attention = AttentionKernel::automatic;
  // Whether it computes through its fused ops; the same results in f32 (Model::set_fused_epilogues).
  FusedEpilogues fused_epilogues = FusedEpilogues::automatic;
  std::vector<std::string> freeze;  // --freeze: parameter name patterns (EngineOptions::freeze)
  bool cuda_graphs = false;         // --cuda-graphs: each step replayed as one CUDA graph (EngineOptions)
};

// How --activation-checkpointing spells a mode: none, blocks.
std::string_view recompute_flag(Recompute mode);
// How --fused-epilogues spells a mode: auto, on, off.
std::string_view fused_epilogues_flag(FusedEpilogues mode);
inline constexpr FusedEpilogues kFusedEpilogueModes[] = {FusedEpilogues::automatic, FusedEpilogues::on,
                                                         FusedEpilogues::off};

// --model (a registry name), --config KEY=VALUE,... and the shorthands --layers --dim --heads --vocab --ctx
// --kv-heads --ffn-dim --rope-theta --tie-embeddings --lora-rank --lora-alpha --lora-targets.
void add_model_flags(CLI::App& app, std::string& model, ModelConfig& overrides);
// --activation-checkpointing none|blocks: the tools that run a model or size its activations.
void add_recompute_flag(CLI::App& app, Recompute& mode);
// How --attention spells a kernel: auto, fused, blocks.
std::string_view attention_flag(AttentionKernel kernel);
// --attention auto|fused|blocks: the tools that run a model or size its activations.
void add_attention_flag(CLI::App& app, AttentionKernel& kernel);
// --freeze PATTERN,...: the tools that train a model or size its memory.
void add_freeze_flag(CLI::App& app, std::vector<std::string>& patterns);
// --fused-epilogues auto|on|off: the tools that run a model or size its scratch.
void add_fused_epilogues_flag(CLI::App& app, FusedEpilogues& mode);
// All of the above with --init-from, --seed, --freeze and --fused-epilogues.
void add_model_flags(CLI::App& app, ModelOptions& options);

// Whether the run freezes parameters (--freeze, or LoRA's base): its checkpoints then hold the trained ones
// only, and a resume takes the frozen ones from --init-from again.
bool freezes_parameters(const ModelOptions& options);

// The registered configuration of the model with the overrides; UsageError naming the flag.
ModelConfig resolve_model_config(const ModelOptions& options);

// Sets what `model` keeps for backward and how it computes from `options`: its recompute mode, its fused
// epilogues, and its attention for computing on `placement`'s device in its dtype (choose_attention:
// --attention fused where it cannot run throws UsageError). Where auto keeps blocks for want of cuDNN, one
// line says so to `note` (when given), once per process.
AttentionKernel configure_model(Model& model, const ModelOptions& options, const Placement& placement,
                                std::ostream* note = nullptr);

}  // namespace zshard
