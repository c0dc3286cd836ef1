// What every option part's flags share: choices by name, numbers-or-words, and zshard's one-line errors.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

namespace zshard {

template <class E>
using Choices = std::vector<std::pair<std::string, E>>;

// The integer `text` spells whole (nothing after it, no overflow), or nothing: for the flags that take a
// number or a word (--batch N|auto, --rank-batches ...|auto, --shard-group G|node).
std::optional<int> whole_int(const std::string& text);

// A flag taking one of `choices` by name into `value` (an E, or an optional one); --help lists the names
// and shows the current value's as the default.
template <class E, class V>
void add_choice(CLI::App& app, const std::string& flag, V& value, const Choices<E>& choices,
                const std::string& help) {
  std::vector<std::string> names;
  std::string current;
  for (const auto& [name, choice] : choices) {
    names.push_back(name);
    if (value == choice) current = name;
  }
  app.add_option_function<std::string>(
         flag,
         [&value, choices](const std::string& given) {
           for (const auto& [name, choice] : choices)
             if (name == given) value = choice;
         },
         help)
      ->check(CLI::IsMember(names))
      ->default_str(current);
}

// A flag taking a comma-separated list, in one argument or several (--world 2,4 or --world 2 4): `take`
// gets the items in order. CLI11's own delimiter drops empty items ("2,,1" reads as 2,1 and "2,1," as
// 2,1), so every list flag splits here instead, refusing an empty item naming the flag.
CLI::Option* add_list_option(CLI::App& app, const std::string& flag,
                             std::function<void(const std::vector<std::string>&)> take, const std::string& help);
// The same into `items`, each item once (a strategy or a file listed twice would run or count twice); with
// `allowed`, each item must be one of those words.
CLI::Option* add_list_option(CLI::App& app, const std::string& flag, std::vector<std::string>& items,
                             const std::string& help, const std::vector<std::string>& allowed = {});
// Refuses item i of a list where an item before it is the same, naming `flag` and the item (what the one
// above checks of each).
void refuse_repeat(const std::string& flag, const std::vector<std::string>& items, size_t i);
// The same into `values`, each item a whole int: once, where a repeat would run or count twice (worlds,
// the values a search tries), or as often as given (sizes of hosts, of nodes).
enum class Repeats { refused, allowed };
CLI::Option* add_list_option(CLI::App& app, const std::string& flag, std::vector<int>& values, const std::string& help,
                             Repeats repeats);

// Refuses an empty value for every option of `app` that takes one (CLI11 would read "" as 0 or as unset).
void refuse_empty_values(CLI::App& app);
// Turns a CLI11 parse error of `app` into the one-line message zshard prints (naming the flag).
std::string cli_error_line(const CLI::Error& e, const CLI::App& app);

}  // namespace zshard
