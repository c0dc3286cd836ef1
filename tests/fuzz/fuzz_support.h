// Shared pieces of the parser fuzzers: a portable deterministic random source, byte-level and JSON-aware
// mutations, and the rule every parser call must keep: it returns, or it throws a zshard::Error whose
// message is one non-empty line. Anything else (another exception type, a message spanning lines, a call
// that should fail but returns) is a BadOutcome; crashes and undefined behaviour are left to ASan/UBSan.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <zshard/error.h>

namespace zshard::fuzz {

// File contents. std::string rather than a byte vector: JSON round-trips and edits stay copy-free.
using Bytes = std::string;

// Inputs never grow past this: larger files only slow the loop without reaching new code.
constexpr size_t kMaxInputBytes = 1 << 20;

// splitmix64: the same sequence on every platform and standard library, so a seed names an input stream
// (std::uniform_int_distribution may differ between libraries).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next() % n; }
  bool one_in(uint64_t n) { return below(n) == 0; }
  template <class T>
  const T& pick(std::span<const T> items) { return items[below(items.size())]; }
  template <class T, size_t N>
  const T& pick(const T (&items)[N]) { return items[below(N)]; }

 private:
  uint64_t state_;
};

// Bit patterns that sit on the edges parsers check (signed and unsigned limits, powers of two).
std::span<const uint64_t> interesting_integers();

// One random byte-level edit: bit flip, interesting byte or integer, truncation, junk appended, a chunk
// duplicated, deleted or overwritten, or one of `tokens` inserted.
void mutate_bytes(Bytes& data, Rng& rng, std::span<const std::string_view> tokens = {});

// One structural edit of a JSON document: a value replaced by an edge-case number, a raw number token the
// parser must cope with, another type or a deep nest; a key removed, added or renamed; a string altered.
// nullopt when `text` is not JSON (or too deeply nested to edit safely).
std::optional<std::string> mutate_json(std::string_view text, Rng& rng);

// Tokens worth splicing into JSON text: structure, edge-case numbers, escapes, literals.
std::span<const std::string_view> json_tokens();

// A parser call that broke the rule; `what` is one line describing it.
struct BadOutcome {
  std::string what;
};

// Throws BadOutcome unless `message` is one non-empty line.
void check_error_message(std::string_view call, const std::string& message);

// Runs a follow-up call on what loaded: true when it returned, false when it threw a well-formed
// zshard::Error. Other exceptions propagate to the driver, which reports them.
template <class Call>
bool attempt(std::string_view call, Call&& run) {
  try {
    run();
    return true;
  } catch (const Error& e) {
    check_error_message(call, e.what());
    return false;
  }
}

// A call the API documents as failing (an unknown name, a range past the end): it must throw a
// well-formed zshard::Error.
template <class Call>
void expect_error(std::string_view call, Call&& run) {
  if (attempt(call, run)) throw BadOutcome{std::string(call) + " returned instead of failing"};
}

void write_file(const std::string& path, std::string_view bytes);
Bytes read_file_bytes(const std::string& path);

// One parser under test. `prepare` writes whatever fixed files the parser needs beside its input into
// `workdir` and returns the valid seed inputs; `mutate` applies one format-aware edit; `exercise` writes
// the input where the parser expects it, runs the parser and then the calls a user makes on what loaded.
// It returns true when the input loaded, and lets the parser's zshard::Error escape when it did not.
struct ParserTarget {
  const char* name;
  std::vector<Bytes> (*prepare)(const std::string& workdir);
  void (*mutate)(Bytes& input, Rng& rng);
  bool (*exercise)(const Bytes& input, const std::string& workdir);
};

const ParserTarget& safetensors_target();
const ParserTarget& manifest_target();
const ParserTarget& llmc_tokens_target();
std::vector<const ParserTarget*> all_targets();
const ParserTarget* find_target(std::string_view name);  // nullptr when there is none by that name

// What one input did: it loaded, or it was rejected with a well-formed error, or `broken_rule` says how
// it broke the rule.
struct Verdict {
  bool loaded = false;
  std::string broken_rule;
};
Verdict run_one(const ParserTarget& target, const Bytes& input, const std::string& workdir);

// A fresh directory under $TMPDIR (or /tmp) for the parsers' files; exits when none can be made.
std::string make_workdir();

}  // namespace zshard::fuzz
