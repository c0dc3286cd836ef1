// JSON files the tools read (zshard-bench results for zshard-mem --check and zshard-project --bench,
// --check): a file that cannot be read, is not JSON, or lacks a field gives one UsageError naming the
// flag, the path and the field, never the parser's raw text.
#pragma once
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include <zshard/error.h>

namespace zshard {

nlohmann::json read_json_file(std::string_view flag, const std::string& path);

// nlohmann's message without its "[json.exception.*]" prefix: "key 'world' not found".
std::string json_reason(const nlohmann::json::exception& e);

// Runs `read` on fields of the file `path` (given to `flag`); a missing or mistyped field becomes one
// UsageError naming both.
template <class Read>
auto read_fields(std::string_view flag, const std::string& path, Read&& read) -> decltype(read()) {
  try {
    return read();
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(detail::concat(flag, " ", path, ": not a zshard-bench result (", json_reason(e), ")"));
  }
}

}  // namespace zshard
