// A model's hyper-parameters by name, each in its own type: what the registry builds a model from, --config
// overrides, and a checkpoint records.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <variant>

namespace zshard {

// One hyper-parameter, kept in its own type: an integer (layers, dim; a switch as 0 or 1) or a real number
// (rope_theta = 500000.0).
class ConfigValue {
 public:
  ConfigValue() = default;  // 0
  ConfigValue(int v) : value_(int64_t(v)) {}
  ConfigValue(int64_t v) : value_(v) {}
  ConfigValue(bool v) : value_(int64_t(v)) {}
  ConfigValue(double v) : value_(v) {}

  bool is_integer() const { return std::holds_alternative<int64_t>(value_); }
  int64_t integer() const;  // throws Error for a real number
  double number() const;    // either kind, as a double
  std::string text() const;  // "12", "500000.0": a real number always shows a point or an exponent
  // Equal values of either kind compare equal (10000 == 10000.0), as in a checkpoint's JSON.
  bool operator==(const ConfigValue& other) const { return number() == other.number(); }

 private:
  std::variant<int64_t, double> value_ = int64_t(0);
};

// A model's hyper-parameters by name, e.g. {"layers": 12, "dim": 768, ...}; each model has its own keys.
using ModelConfig = std::map<std::string, ConfigValue>;

// "layers=12, dim=768": how messages and --help show a configuration.
std::string config_text(const ModelConfig& config);

}  // namespace zshard
