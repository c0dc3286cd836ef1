// The model a run trains, and its flags: --model, --config and its shorthands, --init-from, --seed,
// --activation-checkpointing, --fused-epilogues.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <zshard/model.h>
#include <zshard/model_registry.h>

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
  // Whether it computes through its fused ops; the same results in f32 (Model::set_fused_epilogues).
  FusedEpilogues fused_epilogues = FusedEpilogues::automatic;
  std::vector<std::string> freeze;  // --freeze: parameter name patterns (EngineOptions::freeze)
};

// How --activation-checkpointing spells a mode: none, blocks.
std::string_view recompute_flag(Recompute mode);
// How --fused-epilogues spells a mode: auto, on, off.
std::string_view fused_epilogues_flag(FusedEpilogues mode);

// --model (a registry name), --config KEY=VALUE,... and the shorthands --layers --dim --heads --vocab --ctx
// --kv-heads --ffn-dim --rope-theta --tie-embeddings --lora-rank --lora-alpha --lora-targets.
void add_model_flags(CLI::App& app, std::string& model, ModelConfig& overrides);
// --activation-checkpointing none|blocks: the tools that run a model or size its activations.
void add_recompute_flag(CLI::App& app, Recompute& mode);
// --freeze PATTERN,...: the tools that train a model or size its memory.
void add_freeze_flag(CLI::App& app, std::vector<std::string>& patterns);
// All of the above with --init-from, --seed, --freeze and --fused-epilogues.
void add_model_flags(CLI::App& app, ModelOptions& options);

// Whether the run freezes parameters (--freeze, or LoRA's base): its checkpoints then hold the trained ones
// only, and a resume takes the frozen ones from --init-from again.
bool freezes_parameters(const ModelOptions& options);

// The registered configuration of the model with the overrides; UsageError naming the flag.
ModelConfig resolve_model_config(const ModelOptions& options);

}  // namespace zshard
