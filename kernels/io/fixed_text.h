// A number as text with a fixed count of decimals, for the tools' tables and log lines.
#pragma once
#include <iomanip>
#include <sstream>
#include <string>

namespace zshard {

inline std::string fixed(double v, int digits = 1) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << v;
  return os.str();
}

}  // namespace zshard
