// The command-line flags of zshard-train (also used by zshard-bench): one place that binds every
// TrainOptions field to its flag, with its default shown in --help.
#pragma once
#include <CLI/CLI.hpp>

#include "runtime/trainer.h"

namespace zshard {

void add_train_flags(CLI::App& app, TrainOptions& options, std::string& strategy_name);
// Turns a CLI11 parse error into the one-line message zshard prints (naming the flag).
std::string cli_error_line(const CLI::Error& e);

}  // namespace zshard
