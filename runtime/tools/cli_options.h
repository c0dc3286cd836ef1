// The command-line flags of zshard-train (also used by zshard-bench and, for the model, zshard-mem): one
// place that binds every TrainOptions field to its flag, with its default shown in --help.
#pragma once
#include <CLI/CLI.hpp>

#include "runtime/train/trainer.h"

namespace zshard {

// --model (a registry name), --config KEY=VALUE,... and the shorthands --layers --dim --heads --vocab --ctx.
void add_model_flags(CLI::App& app, std::string& model, ModelConfig& overrides);
// --activation-checkpointing none|blocks: the tools that run a model or size its activations.
void add_checkpointing_flag(CLI::App& app, ActivationCheckpointing& mode);
// --offload none|optimizer: zshard-train, zshard-bench and zshard-mem.
void add_offload_flag(CLI::App& app, bool& offload_optimizer);
// --shard-group G | G1,G2,... | node: hybrid's groups (StrategyOptions::shard_group, shard_group_sizes).
void add_shard_group_flag(CLI::App& app, StrategyOptions& strategy);
// --device cpu|cuda: where the run computes (zshard-mem: where it would).
void add_device_flag(CLI::App& app, Device& device, const std::string& help);
void add_train_flags(CLI::App& app, TrainOptions& options, std::string& strategy_name);
// Refuses an empty value for every option of `app` that takes one (CLI11 would read "" as 0 or as unset).
void refuse_empty_values(CLI::App& app);
// Turns a CLI11 parse error into the one-line message zshard prints (naming the flag).
std::string cli_error_line(const CLI::Error& e);

}  // namespace zshard
