#include "runtime/cli/json_input.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "runtime/cli/path_checks.h"

namespace zshard {

nlohmann::json read_json_file(std::string_view flag, const std::string& path) {
  // A directory opens as a stream, then fails inside the parser with a message that names neither; a FIFO
  // would block the read until a writer came. A missing file is the open's to report.
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) check_input_file(flag, path, "a JSON file");
  std::ifstream in(path);
  if (!in) throw UsageError(detail::concat(flag, " ", path, ": cannot read (", std::strerror(errno), ")"));
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(detail::concat(flag, " ", path, ": not JSON (", json_reason(e), ")"));
  }
}

std::string json_reason(const nlohmann::json::exception& e) {
  std::string text = e.what();
  if (text.rfind("[json.exception.", 0) == 0) {
    if (const size_t end = text.find("] "); end != std::string::npos) text.erase(0, end + 2);
  }
  return text;
}

}  // namespace zshard
