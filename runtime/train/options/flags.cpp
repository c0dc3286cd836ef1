#include "runtime/train/options/flags.h"

#include <stdexcept>

namespace zshard {

std::optional<int> whole_int(const std::string& text) {
  size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size()) return std::nullopt;
  return value;
}

void refuse_empty_values(CLI::App& app) {
  const CLI::Validator non_empty(
      [](const std::string& v) { return v.empty() ? std::string("empty value (leave the flag out for its default)") : ""; },
      "");
  for (CLI::Option* opt : app.get_options())
    if (opt->get_type_size_max() > 0) opt->check(non_empty);
}

std::string cli_error_line(const CLI::Error& e) {
  std::string msg = e.what();
  while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
  for (char& c : msg) if (c == '\n') c = ' ';
  return msg;
}

}  // namespace zshard
