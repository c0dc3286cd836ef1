// The parser fuzzing driver. By default a deterministic mutation loop bounded by time or input count,
// which ctest runs under ASan and UBSan: every seed must load, and every mutated input must load or fail
// with one well-formed zshard::Error. Built with -DZSHARD_LIBFUZZER it is instead a libFuzzer target (the
// parser named by $ZSHARD_FUZZ_PARSER, default safetensors) whose custom mutator applies the same
// format-aware edits.
#include <cxxabi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <typeinfo>

#include "tests/fuzz/fuzz_support.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ZSHARD_FUZZ_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(ZSHARD_FUZZ_ASAN)
#include <sanitizer/common_interface_defs.h>
#define ZSHARD_FUZZ_DEATH_CALLBACK 1
#endif

namespace zshard::fuzz {

namespace {

namespace fs = std::filesystem;

std::vector<const ParserTarget*> all_targets() {
  return {&safetensors_target(), &manifest_target(), &llmc_tokens_target()};
}

const ParserTarget* find_target(std::string_view name) {
  for (const ParserTarget* target : all_targets())
    if (name == target->name) return target;
  return nullptr;
}

std::string demangled(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> name(abi::__cxa_demangle(mangled, nullptr, nullptr, &status),
                                                   &std::free);
  return status == 0 && name ? name.get() : mangled;
}

// What one input did: loaded, or rejected with a well-formed error, or `broken_rule` says what went wrong.
struct Verdict {
  bool loaded = false;
  std::string broken_rule;
};

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

}  // namespace

}  // namespace zshard::fuzz

#ifdef ZSHARD_LIBFUZZER

namespace {
const zshard::fuzz::ParserTarget* g_target = nullptr;
std::string g_workdir;
std::vector<zshard::fuzz::Bytes> g_seeds;
}  // namespace

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* name = std::getenv("ZSHARD_FUZZ_PARSER");
  g_target = zshard::fuzz::find_target(name ? name : "safetensors");
  if (!g_target) {
    std::fprintf(stderr, "ZSHARD_FUZZ_PARSER=%s: not safetensors, manifest or llmc_tokens\n", name);
    std::exit(2);
  }
  g_workdir = zshard::fuzz::make_workdir();
  g_seeds = g_target->prepare(g_workdir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > zshard::fuzz::kMaxInputBytes) return -1;
  const zshard::fuzz::Verdict verdict =
      zshard::fuzz::run_one(*g_target, zshard::fuzz::Bytes(reinterpret_cast<const char*>(data), size), g_workdir);
  if (!verdict.broken_rule.empty()) {
    std::fprintf(stderr, "%s: %s\n", g_target->name, verdict.broken_rule.c_str());
    std::abort();  // libFuzzer saves the input as crash-*
  }
  return 0;
}

// Half libFuzzer's own byte edits, half the format-aware ones; an empty or rare input restarts from a
// valid seed, so no seed corpus is needed.
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  zshard::fuzz::Rng rng(seed);
  if (size > 0 && rng.one_in(2)) return LLVMFuzzerMutate(data, size, max_size);
  zshard::fuzz::Bytes input(reinterpret_cast<const char*>(data), size);
  if (size == 0 || rng.one_in(64)) input = rng.pick(std::span<const zshard::fuzz::Bytes>(g_seeds));
  g_target->mutate(input, rng);
  input.resize(std::min(input.size(), max_size));
  std::memcpy(data, input.data(), input.size());
  return input.size();
}

#else  // the bounded loop ctest runs

namespace zshard::fuzz {
namespace {

struct Options {
  std::vector<const ParserTarget*> targets = all_targets();
  double seconds = 20;
  uint64_t iterations = 0;  // 0: until `seconds` have passed
  uint64_t seed = 20240520;
  std::string replay;       // run this one file instead of fuzzing
  bool keep_going = false;  // report every broken rule instead of stopping at the first
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "fuzz_parsers: %s\n"
               "usage: fuzz_parsers [--parser safetensors|manifest|llmc_tokens|all] [--seconds S]\n"
               "                    [--iterations N] [--seed N] [--replay FILE] [--keep-going]\n"
               "defaults come from $ZSHARD_FUZZ_SECONDS, $ZSHARD_FUZZ_ITERATIONS and $ZSHARD_FUZZ_SEED\n",
               problem.c_str());
  std::exit(2);
}

double parse_number(const std::string& flag, const char* text) {
  char* end = nullptr;
  const double value = text ? std::strtod(text, &end) : -1;
  if (!text || end == text || *end != '\0' || !(value >= 0)) usage(flag + " needs a non-negative number");
  return value;
}

Options parse_options(int argc, char** argv) {
  Options opt;
  if (const char* v = std::getenv("ZSHARD_FUZZ_SECONDS")) opt.seconds = parse_number("ZSHARD_FUZZ_SECONDS", v);
  if (const char* v = std::getenv("ZSHARD_FUZZ_ITERATIONS"))
    opt.iterations = uint64_t(parse_number("ZSHARD_FUZZ_ITERATIONS", v));
  if (const char* v = std::getenv("ZSHARD_FUZZ_SEED")) opt.seed = uint64_t(parse_number("ZSHARD_FUZZ_SEED", v));
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    if (flag == "--keep-going") {
      opt.keep_going = true;
      continue;
    }
    if (!value) usage(flag == "--help" ? "help" : flag + " needs a value or is unknown");
    ++i;
    if (flag == "--parser") {
      if (std::string_view(value) == "all") continue;
      const ParserTarget* target = find_target(value);
      if (!target) usage(std::string("unknown parser ") + value);
      opt.targets = {target};
    } else if (flag == "--seconds") {
      opt.seconds = parse_number(flag, value);
    } else if (flag == "--iterations") {
      opt.iterations = uint64_t(parse_number(flag, value));
    } else if (flag == "--seed") {
      opt.seed = uint64_t(parse_number(flag, value));
    } else if (flag == "--replay") {
      opt.replay = value;
    } else {
      usage("unknown flag " + flag);
    }
  }
  if (!opt.replay.empty() && opt.targets.size() != 1) usage("--replay needs --parser");
  return opt;
}

// A sanitizer report ends the process; this names the input it died on, which stays on disk.
char g_crash_note[1024];
void print_crash_note() {
  if (const ssize_t n = ssize_t(std::strlen(g_crash_note)); n > 0) (void)!::write(2, g_crash_note, size_t(n));
}

// Saves an input that broke a rule and says how to run it again; returns where it went.
std::string save_failure(const std::string& workdir, const char* parser, uint64_t iteration, const Bytes& input) {
  const std::string path = workdir + "/failure-" + std::to_string(iteration) + ".bin";
  write_file(path, input);
  std::fprintf(stderr, "fuzz_parsers: the input is saved at %s; replay it with: fuzz_parsers --parser %s --replay %s\n",
               path.c_str(), parser, path.c_str());
  return path;
}

// Fuzzes one parser; returns the number of inputs that broke a rule.
int fuzz_one(const ParserTarget& target, const Options& opt, const std::string& workdir) {
  const std::vector<Bytes> seeds = target.prepare(workdir);
  const std::string current = workdir + "/current-input";
  std::snprintf(g_crash_note, sizeof g_crash_note,
                "fuzz_parsers: %s crashed on the input saved at %s; replay it with: fuzz_parsers --parser %s "
                "--replay FILE (after copying it)\n",
                target.name, current.c_str(), target.name);

  int failures = 0;
  uint64_t tried = 0, loaded = 0, rejected = 0;
  const auto report = [&](uint64_t iteration, const Bytes& input, const Verdict& verdict) {
    std::fprintf(stderr, "fuzz_parsers: %s, input %llu: %s\n", target.name, (unsigned long long)iteration,
                 verdict.broken_rule.c_str());
    save_failure(workdir, target.name, iteration, input);
    ++failures;
  };
  // A seed that does not load would leave the fuzzer testing only that one rejection.
  for (size_t i = 0; i < seeds.size(); ++i) {
    const Verdict verdict = run_one(target, seeds[i], workdir);
    if (!verdict.loaded && verdict.broken_rule.empty()) {
      std::fprintf(stderr, "fuzz_parsers: %s seed %zu does not load\n", target.name, i);
      save_failure(workdir, target.name, i, seeds[i]);
      return failures + 1;
    }
    if (!verdict.broken_rule.empty()) report(i, seeds[i], verdict);
  }

  Rng rng(opt.seed);
  std::vector<Bytes> pool = seeds;  // grows with mutants that loaded: valid variants to mutate further
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  while (opt.iterations ? tried < opt.iterations : elapsed() < opt.seconds) {
    Bytes input;
    if (rng.one_in(64)) {
      for (uint64_t n = rng.below(2048); n > 0; --n) input.push_back(char(rng.next()));
    } else {
      input = pool[rng.below(pool.size())];
      for (uint64_t rounds = 1 + rng.below(4); rounds > 0; --rounds) target.mutate(input, rng);
    }
    write_file(current, input);
    const Verdict verdict = run_one(target, input, workdir);
    ++tried;
    if (!verdict.broken_rule.empty()) {
      report(tried, input, verdict);
      if (!opt.keep_going) break;
      continue;
    }
    verdict.loaded ? ++loaded : ++rejected;
    if (verdict.loaded && input.size() <= (1 << 16)) {
      if (pool.size() < 256) pool.push_back(input);
      else pool[seeds.size() + rng.below(pool.size() - seeds.size())] = input;
    }
  }
  std::printf("fuzz_parsers %s: %llu inputs tried, %llu loaded, %llu rejected with a zshard::Error, %.1f s "
              "(seed %llu)%s\n",
              target.name, (unsigned long long)tried, (unsigned long long)loaded, (unsigned long long)rejected,
              elapsed(), (unsigned long long)opt.seed, failures ? ", FAILED" : "");
  std::fflush(stdout);
  return failures;
}

int replay(const ParserTarget& target, const std::string& file, const std::string& workdir) {
  target.prepare(workdir);
  const Verdict verdict = run_one(target, read_file_bytes(file), workdir);
  if (!verdict.broken_rule.empty()) {
    std::fprintf(stderr, "fuzz_parsers: %s, %s: %s\n", target.name, file.c_str(), verdict.broken_rule.c_str());
    return 1;
  }
  std::printf("fuzz_parsers %s: %s %s\n", target.name, file.c_str(), verdict.loaded ? "loaded" : "was rejected");
  return 0;
}

}  // namespace
}  // namespace zshard::fuzz

int main(int argc, char** argv) {
  using namespace zshard::fuzz;
  const Options opt = parse_options(argc, argv);
#ifdef ZSHARD_FUZZ_DEATH_CALLBACK
  __sanitizer_set_death_callback(print_crash_note);
#endif
  const std::string root = make_workdir();
  int failures = 0;
  for (const ParserTarget* target : opt.targets) {
    const std::string workdir = root + "/" + target->name;
    std::filesystem::create_directories(workdir);
    try {
      failures += opt.replay.empty() ? fuzz_one(*target, opt, workdir) : replay(*target, opt.replay, workdir);
    } catch (const BadOutcome& harness) {
      std::fprintf(stderr, "fuzz_parsers: %s\n", harness.what.c_str());
      failures += 1;
    } catch (const std::exception& e) {  // building the seeds failed: the writers broke, not the fuzzing
      std::fprintf(stderr, "fuzz_parsers: %s: preparing the seeds failed: %s\n", target->name, e.what());
      failures += 1;
    }
    if (failures && !opt.keep_going) break;
  }
  if (failures) {
    std::fprintf(stderr, "fuzz_parsers: %d input(s) broke the rules; inputs kept under %s\n", failures, root.c_str());
    return 1;
  }
  std::filesystem::remove_all(root);
  return 0;
}

#endif
