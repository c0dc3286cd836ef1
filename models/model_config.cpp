#include <zshard/model_config.h>

#include <iomanip>
#include <sstream>

#include <zshard/error.h>

namespace zshard {

int64_t ConfigValue::integer() const {
  if (const int64_t* i = std::get_if<int64_t>(&value_)) return *i;
  fail("expected an integer, got ", text());
}

double ConfigValue::number() const {
  if (const int64_t* i = std::get_if<int64_t>(&value_)) return double(*i);
  if (const double* d = std::get_if<double>(&value_)) return *d;
  fail("expected a number, got '", text(), "'");
}

std::string ConfigValue::text() const {
  if (const std::string* s = std::get_if<std::string>(&value_)) return *s;
  if (is_integer()) return std::to_string(integer());
  std::ostringstream os;
  os << std::setprecision(17) << number();
  std::string s = os.str();
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // 500000 -> 500000.0; nan and inf stay
  return s;
}

std::string config_text(const ModelConfig& config) {
  std::ostringstream os;
  for (auto it = config.begin(); it != config.end(); ++it)
    os << (it == config.begin() ? "" : ", ") << it->first << "=" << it->second.text();
  return os.str();
}

}  // namespace zshard
