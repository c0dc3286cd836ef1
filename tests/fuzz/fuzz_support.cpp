// The rule every parser call is held to, and running one input through a parser under that rule.
#include "tests/fuzz/fuzz_support.h"

#include <cxxabi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <typeinfo>

namespace zshard::fuzz {

namespace {

std::string demangled(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> name(abi::__cxa_demangle(mangled, nullptr, nullptr, &status),
                                                   &std::free);
  return status == 0 && name ? name.get() : mangled;
}

}  // namespace

void check_error_message(std::string_view call, const std::string& message) {
  if (message.empty()) throw BadOutcome{std::string(call) + " threw a zshard::Error with an empty message"};
  if (message.find_first_of("\r\n") != std::string::npos) {
    // Escaped, so the report itself stays one line.
    const std::string shown =
        nlohmann::json(message.substr(0, 300)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    throw BadOutcome{std::string(call) + " threw a zshard::Error whose message spans lines: " + shown};
  }
}

void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  out.close();
  if (!out) throw BadOutcome{"fuzz harness: cannot write " + path};
}

Bytes read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw BadOutcome{"fuzz harness: cannot read " + path};
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<const ParserTarget*> all_targets() {
  return {&safetensors_target(), &manifest_target(), &llmc_tokens_target()};
}

const ParserTarget* find_target(std::string_view name) {
  for (const ParserTarget* target : all_targets())
    if (name == target->name) return target;
  return nullptr;
}

Verdict run_one(const ParserTarget& target, const Bytes& input, const std::string& workdir) {
  try {
    return {target.exercise(input, workdir), {}};
  } catch (const BadOutcome& bad) {
    return {false, bad.what};
  } catch (const Error& e) {
    try {
      check_error_message(target.name, e.what());
    } catch (const BadOutcome& bad) {
      return {false, bad.what};
    }
    return {false, {}};
  } catch (const std::exception& e) {
    return {false, "threw " + demangled(typeid(e).name()) + " (not a zshard::Error): " + e.what()};
  } catch (...) {
    return {false, "threw something that is not a std::exception"};
  }
}

std::string make_workdir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/zshard-fuzz-XXXXXX";
  if (!::mkdtemp(pattern.data())) {
    std::perror("fuzz_parsers: mkdtemp");
    std::exit(2);
  }
  return pattern;
}

}  // namespace zshard::fuzz
