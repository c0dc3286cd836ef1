#include <zshard/train.h>

#include <string>
#include <string_view>

#include "runtime/tools/tools.h"

namespace zshard {

int train_main(int argc, char** argv, const std::string& name, ModelConfig defaults, ModelBuilder build) {
  register_model(name, std::move(defaults), std::move(build));
  return train_main(argc, argv, name);
}

int train_main(int argc, char** argv, const std::string& default_model) {
  // The mode word is not a flag: the tool gets argv as if it were its own program, named "BINARY MODE" (its
  // usage line), which finds itself through /proc/self/exe, not this name.
  const std::string_view mode = argc > 1 ? argv[1] : "";
  if (mode == "bench" || mode == "mem" || mode == "tune" || mode == "export") {
    static std::string program;
    program = std::string(argv[0]) + " " + std::string(mode);
    argv[1] = program.data();
    if (mode == "tune") return tune_tool(argc - 1, argv + 1, default_model, /*own_modes=*/true);
    if (mode == "export") return export_tool(argc - 1, argv + 1);
    return mode == "bench" ? bench_tool(argc - 1, argv + 1, default_model) : mem_tool(argc - 1, argv + 1, default_model);
  }
  return train_tool(argc, argv, default_model);
}

}  // namespace zshard
