// Text that zshard's file parsers (safetensors headers, checkpoint manifests) read before trusting it.
#pragma once
#include <functional>
#include <string_view>

#include <nlohmann/json.hpp>

namespace zshard {

// True when `text` holds a control character: quoted in a one-line error message, it would break the line.
bool has_control_character(std::string_view text);

// Parses JSON nested at most `max_depth` levels; past that calls `too_deep`, which must throw. nlohmann
// dumps, copies and compares recursively, so a document nested thousands of levels deep would overflow
// the stack later (in an error message, say). Malformed JSON throws nlohmann's parse_error, as parse does.
nlohmann::json parse_json_with_depth_limit(std::string_view text, int max_depth,
                                           const std::function<void()>& too_deep);

}  // namespace zshard
