#include "kernels/io/file_json.h"

#include <algorithm>

namespace zshard {

bool has_control_character(std::string_view text) {
  return std::any_of(text.begin(), text.end(), [](unsigned char c) { return c < 0x20 || c == 0x7f; });
}

nlohmann::json parse_json_with_depth_limit(std::string_view text, int max_depth,
                                           const std::function<void()>& too_deep) {
  return nlohmann::json::parse(text, [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > max_depth) too_deep();
    return true;
  });
}

}  // namespace zshard
