// A model's hyper-parameters by name, each in its own type: what the registry builds a model from, --config
// overrides, and a checkpoint records.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <variant>

namespace zshard {

// One hyper-parameter, kept in its own type: an integer (layers, dim; a switch as 0 or 1), a real number
// (rope_theta = 500000.0) or a short text (lora_targets = "q_proj,v_proj": a list, comma separated).
class ConfigValue {
 public:
  ConfigValue() = default;  // 0
  ConfigValue(int v) : value_(int64_t(v)) {}
  ConfigValue(int64_t v) : value_(v) {}
  ConfigValue(bool v) : value_(int64_t(v)) {}
  ConfigValue(double v) : value_(v) {}
  ConfigValue(std::string v) : value_(std::move(v)) {}
  ConfigValue(const char* v) : value_(std::string(v)) {}

  bool is_integer() const { return std::holds_alternative<int64_t>(value_); }
  bool is_text() const { return std::holds_alternative<std::string>(value_); }
  int64_t integer() const;  // throws Error for a real number or a text
  double number() const;    // either kind of number, as a double; throws Error for a text
  std::string text() const;  // "12", "500000.0" (a real number always shows a point or an exponent), a text as it is
  // Equal numbers of either kind compare equal (10000 == 10000.0), as in a checkpoint's JSON; a text equals
  // the same text only.
  bool operator==(const ConfigValue& other) const {
    if (is_text() || other.is_text()) return is_text() && other.is_text() && text() == other.text();
    return number() == other.number();
  }

 private:
  std::variant<int64_t, double, std::string> value_ = int64_t(0);
};

// A model's hyper-parameters by name, e.g. {"layers": 12, "dim": 768, ...}; each model has its own keys.
using ModelConfig = std::map<std::string, ConfigValue>;

// "layers=12, dim=768": how messages and --help show a configuration.
std::string config_text(const ModelConfig& config);

}  // namespace zshard
