// The parser fuzzing driver. By default a deterministic mutation loop bounded by time or input count,
// which ctest runs under ASan and UBSan: every seed must load, every regression input (files that once
// broke a rule) and every mutated input must load or fail with one well-formed zshard::Error. Built with
// -DZSHARD_LIBFUZZER it is instead a libFuzzer target (the parser named by $ZSHARD_FUZZ_PARSER, default
// safetensors) whose custom mutator applies the same format-aware edits.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "tests/fuzz/fuzz_support.h"

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
  // libFuzzer keeps crashing inputs itself; the parsers' scratch files go when it exits normally.
  std::atexit([] { std::filesystem::remove_all(g_workdir); });
  g_seeds = g_target->prepare(g_workdir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > zshard::fuzz::kMaxInputBytes) return -1;
  const zshard::fuzz::Bytes input(reinterpret_cast<const char*>(data), size);
  const zshard::fuzz::Verdict verdict = zshard::fuzz::run_one(*g_target, input, g_workdir);
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
  std::string regressions;  // DIR: run DIR/<parser>/* before fuzzing
  bool keep_going = false;  // report every broken rule instead of stopping at the first
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "fuzz_parsers: %s\n"
               "usage: fuzz_parsers [--parser safetensors|manifest|llmc_tokens|all] [--seconds S]\n"
               "                    [--iterations N] [--seed N] [--regressions DIR] [--replay FILE]\n"
               "                    [--keep-going]\n"
               "defaults come from $ZSHARD_FUZZ_SECONDS, $ZSHARD_FUZZ_ITERATIONS and $ZSHARD_FUZZ_SEED\n",
               problem.c_str());
  std::exit(2);
}

double parse_seconds(const std::string& flag, const char* text) {
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(value >= 0)) usage(flag + " needs a non-negative number of seconds");
  return value;
}

uint64_t parse_count(const std::string& flag, const char* text) {
  char* end = nullptr;
  errno = 0;
  const uint64_t value = std::strtoull(text, &end, 10);
  if (end == text || *end != '\0' || *text == '-' || errno != 0)
    usage(flag + " needs a non-negative integer");
  return value;
}

Options parse_options(int argc, char** argv) {
  Options opt;
  if (const char* v = std::getenv("ZSHARD_FUZZ_SECONDS"))
    opt.seconds = parse_seconds("$ZSHARD_FUZZ_SECONDS", v);
  if (const char* v = std::getenv("ZSHARD_FUZZ_ITERATIONS"))
    opt.iterations = parse_count("$ZSHARD_FUZZ_ITERATIONS", v);
  if (const char* v = std::getenv("ZSHARD_FUZZ_SEED")) opt.seed = parse_count("$ZSHARD_FUZZ_SEED", v);
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
      opt.seconds = parse_seconds(flag, value);
    } else if (flag == "--iterations") {
      opt.iterations = parse_count(flag, value);
    } else if (flag == "--seed") {
      opt.seed = parse_count(flag, value);
    } else if (flag == "--replay") {
      opt.replay = value;
    } else if (flag == "--regressions") {
      opt.regressions = value;
    } else {
      usage("unknown flag " + flag);
    }
  }
  if (!opt.replay.empty() && opt.targets.size() != 1) usage("--replay needs --parser");
  if (!opt.regressions.empty() && !std::filesystem::is_directory(opt.regressions))
    usage("--regressions " + opt.regressions + " is not a directory");
  return opt;
}

// Keeps an input that broke a rule and says how to run it again.
void save_failure(const std::string& workdir, const char* parser, const std::string& label,
                  const Bytes& input) {
  std::string name = label.substr(label.find_last_of('/') + 1);
  std::replace(name.begin(), name.end(), ' ', '-');
  const std::string path = workdir + "/failure-" + name;
  write_file(path, input);
  std::fprintf(stderr,
               "fuzz_parsers: the input is saved at %s; replay it with:\n"
               "  fuzz_parsers --parser %s --replay %s\n",
               path.c_str(), parser, path.c_str());
}

// Files in DIR/<parser>/, sorted: inputs that once broke a rule stay tested after the fix.
std::vector<std::string> regression_files(const std::string& dir, const char* parser) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/" + parser, ec))
    if (entry.is_regular_file()) files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

// Fuzzes one parser; returns the number of inputs that broke a rule.
int fuzz_one(const ParserTarget& target, const Options& opt, const std::string& workdir) {
  const std::vector<Bytes> seeds = target.prepare(workdir);
  // A sanitizer report ends the process with no chance to save the input, so every input is on disk
  // before it runs.
  const std::string current = workdir + "/current-input";
  std::printf("fuzz_parsers %s: each input is at %s while it runs; after a sanitizer report, replay it with\n"
              "  fuzz_parsers --parser %s --replay %s\n",
              target.name, current.c_str(), target.name, current.c_str());
  std::fflush(stdout);
  const auto run_saved = [&](const Bytes& input) {
    write_file(current, input);
    return run_one(target, input, workdir);
  };
  int failures = 0;
  const auto broke_rule = [&](const std::string& label, const Bytes& input, const std::string& what) {
    std::fprintf(stderr, "fuzz_parsers: %s, %s: %s\n", target.name, label.c_str(), what.c_str());
    save_failure(workdir, target.name, label, input);
    ++failures;
    return !opt.keep_going;
  };

  // A seed that does not load would leave the fuzzer testing only that one rejection.
  for (size_t i = 0; i < seeds.size(); ++i) {
    const Verdict verdict = run_saved(seeds[i]);
    if (verdict.loaded && verdict.broken_rule.empty()) continue;
    const std::string what = verdict.broken_rule.empty() ? "does not load" : verdict.broken_rule;
    if (broke_rule("seed " + std::to_string(i), seeds[i], what)) return failures;
  }
  std::vector<Bytes> pool = seeds;  // grows with mutants that loaded: valid variants to mutate further
  size_t regressions = 0;
  for (const std::string& file : opt.regressions.empty() ? std::vector<std::string>{}
                                                          : regression_files(opt.regressions, target.name)) {
    pool.push_back(read_file_bytes(file));
    ++regressions;
    const Verdict verdict = run_saved(pool.back());
    if (!verdict.broken_rule.empty() && broke_rule(file, pool.back(), verdict.broken_rule)) return failures;
  }
  const size_t fixed_pool = pool.size();

  Rng rng(opt.seed);
  uint64_t tried = 0, loaded = 0, rejected = 0;
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  while (opt.iterations ? tried < opt.iterations : elapsed() < opt.seconds) {
    Bytes input;
    if (rng.one_in(64)) {
      for (uint64_t n = rng.below(2048); n > 0; --n) input.push_back(char(rng.next()));
    } else {
      input = pool[rng.below(pool.size())];
      for (uint64_t rounds = 1 + rng.below(4); rounds > 0; --rounds) target.mutate(input, rng);
    }
    const Verdict verdict = run_saved(input);
    ++tried;
    if (!verdict.broken_rule.empty()) {
      if (broke_rule("input " + std::to_string(tried), input, verdict.broken_rule)) break;
      continue;
    }
    verdict.loaded ? ++loaded : ++rejected;
    if (verdict.loaded && input.size() <= (1 << 16)) {
      if (pool.size() < fixed_pool + 256) pool.push_back(input);
      else pool[fixed_pool + rng.below(pool.size() - fixed_pool)] = input;
    }
  }
  using ull = unsigned long long;
  std::printf("fuzz_parsers %s: %zu seeds, %zu regression inputs; %llu inputs tried, %llu loaded, "
              "%llu rejected with a zshard::Error, %.1f s (seed %llu)%s\n",
              target.name, seeds.size(), regressions, ull(tried), ull(loaded), ull(rejected), elapsed(),
              ull(opt.seed), failures ? ", FAILED" : "");
  std::fflush(stdout);
  return failures;
}

int replay(const ParserTarget& target, const std::string& file, const std::string& workdir) {
  target.prepare(workdir);
  const Verdict verdict = run_one(target, read_file_bytes(file), workdir);
  if (!verdict.broken_rule.empty()) {
    std::fprintf(stderr, "fuzz_parsers: %s, %s: %s\n", target.name, file.c_str(),
                 verdict.broken_rule.c_str());
    return 1;
  }
  std::printf("fuzz_parsers %s: %s %s\n", target.name, file.c_str(),
              verdict.loaded ? "loaded" : "was rejected with a well-formed zshard::Error");
  return 0;
}

}  // namespace
}  // namespace zshard::fuzz

int main(int argc, char** argv) {
  using namespace zshard::fuzz;
  const Options opt = parse_options(argc, argv);
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
    } catch (const std::exception& e) {  // outside any parser call: the seeds' writers or the file system
      std::fprintf(stderr, "fuzz_parsers: %s: %s\n", target->name, e.what());
      failures += 1;
    }
    if (failures && !opt.keep_going) break;
  }
  if (failures) {
    std::fprintf(stderr, "fuzz_parsers: %d input(s) broke the rules; inputs kept under %s\n", failures,
                 root.c_str());
    return 1;
  }
  std::filesystem::remove_all(root);
  return 0;
}

#endif
