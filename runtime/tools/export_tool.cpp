// zshard-export (export_tool): writes a checkpoint's weights as one safetensors file, for --init-from and
// for PyTorch: every parameter with the model's names and layouts (F32); for a LoRA fine-tune the adapters
// alone under PEFT's names with PEFT's adapter_config.json beside them, or with --merge-lora the adapters
// folded into the base (runtime/train/weights_export.h). One process, whatever world size saved it: it
// verifies every rank file's checksum, then reads only the parameter tensors, never the Adam state.
#include <iostream>

#include <zshard/error.h>

#include "runtime/cli/path_checks.h"
#include "runtime/tools/tool_runner.h"
#include "runtime/tools/tools.h"
#include "runtime/train/weights_export.h"

namespace zshard {

int export_tool(int argc, char** argv) {
  ExportRequest request;
  CLI::App app{"zshard-export: consolidate a zshard checkpoint into a safetensors weights file"};
  app.add_option("checkpoint", request.checkpoint, "checkpoint directory (holding manifest.json)")->required();
  app.add_option("output", request.output, "safetensors file to write")->required();
  app.add_flag("--merge-lora", request.merge_lora,
               "fold the LoRA adapters into their layers' weights (base + alpha/r * B @ A): the weights of the "
               "same model without LoRA");
  app.add_option("--init-from", request.init_from,
                 "the frozen weights the checkpoint was trained beside (the --init-from of its run), which "
                 "--merge-lora and a --freeze checkpoint need; default: the seed the checkpoint names");
  return run_local_tool("zshard-export", argc, argv, app, [&] {
    // zshard-train's BASE,ADAPTERS has no place here: the checkpoint holds the adapters.
    if (request.init_from.find(',') != std::string::npos)
      throw UsageError(detail::concat("--init-from ", request.init_from, ": takes the base's weights file alone ",
                                      "(the checkpoint holds the adapters; a path cannot hold a comma)"));
    check_output_path("output", request.output);
    check_not_input({"output", request.output}, {{"checkpoint", request.checkpoint}, {"--init-from", request.init_from}});
    for (const std::string& file : export_weights(request)) std::cout << "zshard-export: wrote " << file << "\n";
    return 0;
  });
}

}  // namespace zshard
