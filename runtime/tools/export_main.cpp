// zshard-export: writes a checkpoint's parameters as one safetensors file with the model's parameter names
// and layouts (F32), for --init-from and for PyTorch. One process, whatever world size saved it: it
// verifies every rank file's checksum, then reads only the parameter tensors, never the Adam state.
#include <iostream>

#include "kernels/io/atomic_file.h"
#include "runtime/cli/path_checks.h"
#include "runtime/tools/tool_runner.h"
#include "shard/checkpoint_format.h"

using namespace zshard;

int main(int argc, char** argv) {
  std::string dir, out;
  CLI::App app{"zshard-export: consolidate a zshard checkpoint into a safetensors weights file"};
  app.add_option("checkpoint", dir, "checkpoint directory (holding manifest.json)")->required();
  app.add_option("output", out, "safetensors file to write")->required();
  return run_local_tool("zshard-export", argc, argv, app, [&] {
    check_output_path("output", out);
    check_not_input({"output", out}, {{"checkpoint", dir}});
    export_checkpoint(dir, out);
    std::cout << "zshard-export: wrote " << out << "\n";
    return 0;
  });
}
