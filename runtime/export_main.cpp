// zshard-export: writes a checkpoint's parameters as one safetensors file with Hugging Face GPT-2 names
// and layouts (F32), for --init-from and for PyTorch. One process, whatever world size saved it: it
// verifies every rank file's checksum, then reads only the parameter tensors, never the Adam state.
#include <iostream>

#include "runtime/cli_options.h"
#include "shard/checkpoint.h"

using namespace zshard;

int main(int argc, char** argv) {
  std::string dir, out;
  CLI::App app{"zshard-export: consolidate a zshard checkpoint into a safetensors weights file"};
  app.add_option("checkpoint", dir, "checkpoint directory (holding manifest.json)")->required();
  app.add_option("output", out, "safetensors file to write")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::Error& e) {
    if (e.get_exit_code() == 0) {
      std::cout << app.help();
      return 0;
    }
    std::cerr << "zshard-export: " << cli_error_line(e) << "\n";
    return 2;
  }
  try {
    export_checkpoint(dir, out);
  } catch (const Error& e) {
    std::cerr << "zshard-export: error: " << e.what() << "\n";
    return 1;
  }
  std::cout << "zshard-export: wrote " << out << "\n";
  return 0;
}
