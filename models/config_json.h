// A model's configuration in JSON (checkpoint manifests, benchmark reports): integers as JSON integers,
// real numbers as JSON floats, texts as JSON strings, so a value reads back in the type it was written in.
#pragma once
#include <nlohmann/json.hpp>

#include <zshard/model_config.h>

namespace nlohmann {
template <>
struct adl_serializer<zshard::ConfigValue> {
  static void to_json(json& j, const zshard::ConfigValue& v) {
    if (v.is_integer()) j = v.integer();
    else if (v.is_text()) j = v.text();
    else j = v.number();
  }
  static zshard::ConfigValue from_json(const json& j) {
    if (j.is_number_integer()) return zshard::ConfigValue(j.get<int64_t>());
    if (j.is_string()) return zshard::ConfigValue(j.get<std::string>());
    return zshard::ConfigValue(j.get<double>());
  }
};
}  // namespace nlohmann
