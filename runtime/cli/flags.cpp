#include "runtime/cli/flags.h"

#include <algorithm>
#include <optional>
#include <stdexcept>

namespace zshard {

namespace {

std::string join(const std::vector<std::string>& items) {
  std::string text;
  for (const std::string& item : items) text += (text.empty() ? "" : ",") + item;
  return text;
}

}  // namespace

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

CLI::Option* add_list_option(CLI::App& app, const std::string& flag,
                             std::function<void(const std::vector<std::string>&)> take, const std::string& help) {
  return app.add_option_function<std::vector<std::string>>(
      flag,
      [flag, take](const std::vector<std::string>& args) {
        std::vector<std::string> items;
        for (const std::string& arg : args)
          for (size_t begin = 0;;) {
            const size_t comma = arg.find(',', begin);
            items.push_back(arg.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin));
            if (items.back().empty()) throw CLI::ValidationError(flag, "empty item in the list '" + arg + "'");
            if (comma == std::string::npos) break;
            begin = comma + 1;
          }
        take(items);
      },
      help);
}

void refuse_repeat(const std::string& flag, const std::vector<std::string>& items, size_t i) {
  if (std::find(items.begin(), items.begin() + ptrdiff_t(i), items[i]) != items.begin() + ptrdiff_t(i))
    throw CLI::ValidationError(flag, "'" + items[i] + "' is listed twice");
}

CLI::Option* add_list_option(CLI::App& app, const std::string& flag, std::vector<std::string>& items,
                             const std::string& help, const std::vector<std::string>& allowed) {
  return add_list_option(
             app, flag,
             [&items, flag, allowed](const std::vector<std::string>& given) {
               for (size_t i = 0; i < given.size(); ++i) {
                 if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), given[i]) == allowed.end())
                   throw CLI::ValidationError(flag, "'" + given[i] + "' is not one of " + join(allowed));
                 refuse_repeat(flag, given, i);
               }
               items = given;
             },
             help)
      ->default_str(join(items));
}

CLI::Option* add_list_option(CLI::App& app, const std::string& flag, std::vector<int>& values, const std::string& help,
                             Repeats repeats) {
  std::vector<std::string> defaults;
  for (int v : values) defaults.push_back(std::to_string(v));
  return add_list_option(
             app, flag,
             [&values, flag, repeats](const std::vector<std::string>& given) {
               values.clear();
               for (const std::string& item : given) {
                 const std::optional<int> n = whole_int(item);
                 if (!n) throw CLI::ValidationError(flag, "expected integers, got '" + item + "'");
                 if (repeats == Repeats::refused && std::find(values.begin(), values.end(), *n) != values.end())
                   throw CLI::ValidationError(flag, "'" + item + "' is listed twice");
                 values.push_back(*n);
               }
             },
             help)
      ->default_str(join(defaults));
}

void refuse_empty_values(CLI::App& app) {
  // A flag has a default to fall back on; a required positional (zshard-export's CHECKPOINT) does not.
  const auto non_empty = [](const char* remedy) {
    return CLI::Validator(
        [remedy](const std::string& v) { return v.empty() ? std::string("empty value (") + remedy + ")" : ""; }, "");
  };
  // A positional of many words (zshard-run's training command) is another program's arguments, whose own
  // flags are checked where they are read, naming them.
  for (CLI::Option* opt : app.get_options())
    if (opt->get_type_size_max() > 0 && !(opt->get_lnames().empty() && opt->get_items_expected_max() > 1))
      opt->check(opt->get_required() && opt->get_lnames().empty() ? non_empty("the argument is required")
                                                                   : non_empty("leave the flag out for its default"));
}

namespace {

// CLI11 says "Could not convert: --lr = abc" for a value its type cannot hold (a word, a fraction for an
// integer, a number out of range): reworded as the flags' own checks speak, naming what was expected.
std::optional<std::string> conversion_line(const std::string& msg, const CLI::App& app) {
  const std::string prefix = "Could not convert: ";
  const size_t eq = msg.find(" = ");
  if (msg.rfind(prefix, 0) != 0 || eq == std::string::npos) return std::nullopt;
  const std::string flag = msg.substr(prefix.size(), eq - prefix.size());
  const CLI::Option* opt = app.get_option_no_throw(flag);
  const std::string type = opt ? opt->get_type_name() : "";
  const std::string expected = type == "INT"    ? "an integer"
                               : type == "UINT" ? "a whole number"
                               : type == "FLOAT" ? "a number"
                                                 : "a value of type " + (type.empty() ? "the flag's" : type);
  return flag + ": expected " + expected + " within range, got '" + msg.substr(eq + 3) + "'";
}

}  // namespace

std::string cli_error_line(const CLI::Error& e, const CLI::App& app) {
  std::string msg = e.what();
  while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
  for (char& c : msg) if (c == '\n') c = ' ';
  if (dynamic_cast<const CLI::ConversionError*>(&e))
    if (std::optional<std::string> line = conversion_line(msg, app)) return *line;
  return msg;
}

}  // namespace zshard
