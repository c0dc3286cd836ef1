// The weights files that zshard-train's --save and zshard-export write. A model without LoRA: every
// parameter under the model's names (what --init-from reads). With LoRA: the adapters alone under PEFT's
// names, with PEFT's adapter_config.json beside them, as PEFT's save_pretrained writes a fine-tune (its base
// is the file or seed it started from). zshard-export --merge-lora folds the adapters into the base
// instead: the weights of the same model without LoRA.
#pragma once
#include <string>
#include <vector>

#include <zshard/communicator.h>
#include <zshard/engine.h>
#include <zshard/model.h>

#include "shard/weights_file.h"

namespace zshard {

// Checks before any rank allocates that --init-from `path` is a weights file of `model` (every parameter,
// a base model's, or the adapters alone; shapes, nothing foreign) and, for adapters alone with PEFT's
// adapter_config.json beside them, adapters of the run's rank, alpha and targets: UsageError naming the flag.
// Returns which share of the model's parameters the file holds.
WeightsCoverage check_init_from(const std::string& path, const Model& model);
// --init-from BASE,ADAPTERS (`adapters` empty: BASE alone) as above: BASE must hold base weights (a file of
// the adapters alone would leave the base at the seed), ADAPTERS the adapters alone.
void check_init_base_and_adapters(const std::string& base, const std::string& adapters, const Model& model);

// Before a run or an export writes LoRA adapters to `weights_path` (through `flag`): refuses to overwrite
// an adapter_config.json beside it that describes other adapters, unless the file is the directory's
// adapter_model.safetensors, which it replaces with them.
void check_adapter_config_output(std::string_view flag, const std::string& weights_path, const Model& model);

// --save: the final weights of `model`, trained by `engine`, as above. Returns the files written.
// Collective.
std::vector<std::string> save_weights(Engine& engine, const Model& model, comm::Communicator& world,
                                      const std::string& path);

struct ExportRequest {
  std::string checkpoint;  // a checkpoint directory (holding manifest.json)
  std::string output;      // the safetensors file to write
  std::string init_from;   // the frozen weights the checkpoint names but does not hold; empty: its seed
  bool merge_lora = false;
};
// zshard-export: what --save would have written at the checkpoint's step, or with merge_lora the merged
// weights. The checkpoint's files suffice where they hold all of that (a model with nothing frozen; LoRA
// adapters alone); otherwise the model is rebuilt around them on its frozen weights, from init_from or
// the seed the checkpoint names, which must be the weights it was trained beside (their fingerprint).
// UsageError for merge_lora without adapters, frozen weights other than the checkpoint's or not given,
// and an init_from that nothing needs. Returns the files written.
std::vector<std::string> export_weights(const ExportRequest& request);

}  // namespace zshard
