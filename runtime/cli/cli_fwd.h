// CLI::App, declared for headers that only name it. CLI11 is header-only and costs seconds of compile time
// in every file that includes it, so only the files that add or parse flags include <CLI/CLI.hpp>.
#pragma once

namespace CLI {
class App;
}  // namespace CLI
