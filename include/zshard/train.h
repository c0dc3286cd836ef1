// The one call that makes a binary a zshard trainer:
//
//   int main(int argc, char** argv) {
//     return zshard::train_main(argc, argv, "my-model", {{"vocab", 256}, {"dim", 64}}, build_my_model);
//   }
//
// gives the binary every zshard-train flag (strategies, accumulation, per-rank batches, clipping,
// checkpoints and resume, the memory check and report, JSON logs, device and dtype flags) for its model,
// and four more modes by first argument: `my_binary bench ...` is zshard-bench, `my_binary mem ...`
// zshard-mem, `my_binary tune ...` zshard-tune (run as one process: it launches its own runs) and
// `my_binary export ...` zshard-export (for the checkpoints of its model), same flags, output and JSON.
// Every model of the registry stays available by --model.
//
// It is the tools' library: link zshard::tools (a loop of one's own around <zshard/engine.h> links
// zshard::core alone).
#pragma once
#include <string>

#include <zshard/model.h>
#include <zshard/model_registry.h>
#include <zshard/ops.h>
#include <zshard/tensor.h>

namespace zshard {

// Registers `name` (<zshard/model_registry.h>), makes it the default --model, and runs the mode argv asks
// for. Returns the exit code: 0, 1 for a failure, 2 for bad flags.
int train_main(int argc, char** argv, const std::string& name, ModelConfig defaults, ModelBuilder build);

// The same on the registered models alone, with `default_model` as the default --model.
int train_main(int argc, char** argv, const std::string& default_model = "tiny");

}  // namespace zshard
