#include "runtime/cli/memory_flags.h"

#include <cctype>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <zshard/error.h>

namespace zshard {

int64_t parse_bytes(const std::string& text, const std::string& flag) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    refuse(flag, " must be a size such as 80GiB, 40GB or 1.5e9, got '", text, "'");
  }
  std::string unit = text.substr(used);
  for (char& ch : unit) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  const std::vector<std::pair<std::string, double>> units = {
      {"", 1},          {"b", 1},           {"kb", 1e3},        {"mb", 1e6},           {"gb", 1e9},
      {"tb", 1e12},     {"kib", 1024.0},    {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
  for (const auto& [name, scale] : units)
    if (unit == name) {
      if (!(value > 0) || !std::isfinite(value)) refuse(flag, " must be positive, got '", text, "'");
      if (value * scale >= 9e18) refuse(flag, " is too large, got '", text, "'");
      // A fraction of a byte would truncate to 0, which no size means (a sweep from 0 never grows).
      if (value * scale < 1) refuse(flag, " must be at least 1 byte, got '", text, "'");
      return int64_t(value * scale);
    }
  refuse(flag, ": unknown unit '", text.substr(used), "' (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)");
}

DType parse_dtype_policy(const std::string& name) {
  if (name == "fp32") return DType::f32;
  if (name == "mixed") return DType::bf16;
  refuse("--dtype must be fp32 or mixed, got '", name, "'");
}

}  // namespace zshard
