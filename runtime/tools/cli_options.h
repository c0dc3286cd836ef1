// The command-line flags of zshard-train (also used by zshard-bench and, for the model, zshard-mem): one
// place that binds every TrainOptions field to its flag, with its default shown in --help.
#pragma once
#include <functional>
#include <string>
#include <vector>

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
// A flag taking a comma-separated list, in one argument or several (--world 2,4 or --world 2 4): `take`
// gets the items in order. CLI11's own delimiter drops empty items ("2,,1" reads as 2,1 and "2,1," as
// 2,1), so every list flag splits here instead, refusing an empty item naming the flag.
CLI::Option* add_list_option(CLI::App& app, const std::string& flag,
                             std::function<void(const std::vector<std::string>&)> take, const std::string& help);
// The same into `items`; with `allowed`, each item must be one of those words.
CLI::Option* add_list_option(CLI::App& app, const std::string& flag, std::vector<std::string>& items,
                             const std::string& help, const std::vector<std::string>& allowed = {});
// The same into `values`, each item a whole int.
CLI::Option* add_list_option(CLI::App& app, const std::string& flag, std::vector<int>& values, const std::string& help);
// Refuses an empty value for every option of `app` that takes one (CLI11 would read "" as 0 or as unset).
void refuse_empty_values(CLI::App& app);
// Turns a CLI11 parse error into the one-line message zshard prints (naming the flag).
std::string cli_error_line(const CLI::Error& e);

}  // namespace zshard
