// The mutations shared by the parser fuzzers: byte-level edits for any format and structural edits of
// JSON documents (safetensors headers, checkpoint manifests).
#include "tests/fuzz/fuzz_support.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <nlohmann/json.hpp>

namespace zshard::fuzz {

namespace {

using nlohmann::json;

constexpr uint64_t kInterestingIntegers[] = {
    0, 1, 2, 7, 8, 0x7f, 0x80, 0xff, 0x100, 0x3ff, 0x400, 0x7fff, 0x8000, 0xffff, 0x10000,
    0x7fffffff, 0x80000000, 0xffffffff, 0x100000000ull, 20240520 /* llm.c magic */,
    0x7fffffffffffffffull, 0x8000000000000000ull, 0xffffffffffffffffull, 0xfffffffffffffff8ull};

constexpr std::string_view kJsonTokens[] = {
    "\"", "{", "}", "[", "]", ",", ":", "null", "true", "false", "0", "-1", "1e30", "-0", "1.5",
    "18446744073709551615", "18446744073709551616", "9223372036854775807", "-9223372036854775808",
    "1e400", "\\n", "\\u0000", "\\\"", "\\ud800", "{}", "[]", "\"\"", " "};

// Raw number tokens that no nlohmann value dumps to: out-of-range and odd spellings.
constexpr std::string_view kRawNumbers[] = {
    "1e400", "-1e400", "1e-400", "123456789012345678901234567890", "-123456789012345678901234567890",
    "-0", "0.0", "1E2", "4e9", "4294967296.5", "-9223372036854775809", "18446744073709551616"};

// Keys that parsers look up or treat specially, and names that break naive message formatting.
constexpr std::string_view kJsonKeys[] = {
    "", "__metadata__", "dtype", "shape", "data_offsets", "format", "version", "step", "group_size",
    "units", "files", "run", "name", "params", "numel", "padded_numel", "shard_numel", "offset",
    "weight_decay", "shard", "bytes", "fnv1a64", "xxh3_64", "line\nbreak", "carriage\rreturn", "quote\"d", "\x7f"};

// Strings cut inside a UTF-8 sequence must not stop the mutator: they dump with replacement characters.
std::string dump_lenient(const json& j, int indent = -1) {
  return j.dump(indent, ' ', false, json::error_handler_t::replace);
}

json interesting_json_number(Rng& rng) {
  switch (rng.below(4)) {
    case 0: return rng.pick(kInterestingIntegers);
    case 1: return -int64_t(rng.pick(kInterestingIntegers) & 0x7fffffffffffffffull);
    case 2: {
      constexpr double kFloats[] = {-1.0, -0.5, 0.5, 1.5, 1e30, -1e30, 1e19, 9.3e18, 4294967296.0, 1e-30};
      return rng.pick(kFloats);
    }
    default: return int64_t(rng.below(9)) - 2;
  }
}

// Small steps around the current value find off-by-one checks that edge constants skip over. Signed values
// step in unsigned arithmetic, which wraps at the limits instead of overflowing.
json nudged_number(const json& v, Rng& rng) {
  const int64_t step = rng.one_in(2) ? 1 : -1;
  if (v.is_number_unsigned()) return v.get<uint64_t>() + uint64_t(step);
  if (v.is_number_integer()) {
    const uint64_t bits = uint64_t(v.get<int64_t>());
    return int64_t(rng.one_in(4) ? 0 - bits : bits + uint64_t(step));
  }
  if (v.is_number_float()) return v.get<double>() * (rng.one_in(2) ? 2.0 : -1.0);
  return step;
}

json other_type(const json& v, Rng& rng) {
  switch (rng.below(9)) {
    case 0: return nullptr;
    case 1: return true;
    case 2: return "";
    case 3: return "x";
    case 4: return json::array();
    case 5: return json::object();
    case 6: return json::array({v});
    case 7: return json{{"k", v}};
    default: return dump_lenient(v);
  }
}

std::string edited_string(const std::string& s, Rng& rng) {
  switch (rng.below(5)) {
    case 0: return s + "\n";
    case 1: return s + "\"";
    case 2: return "";
    case 3: {
      std::string long_string;
      for (int i = 0; i < 1000; ++i) long_string += s.empty() ? "x" : s;
      return long_string;
    }
    default: return s.empty() ? s : s.substr(0, rng.below(s.size()));
  }
}

// The deepest bracket nesting of a text: nlohmann dumps and compares recursively, so the mutator must not
// load documents it could not dump again without exhausting the stack.
size_t nesting_depth(std::string_view text) {
  size_t depth = 0, deepest = 0;
  for (char c : text) {
    if (c == '[' || c == '{') deepest = std::max(deepest, ++depth);
    if ((c == ']' || c == '}') && depth > 0) --depth;
  }
  return deepest;
}

}  // namespace

std::span<const uint64_t> interesting_integers() { return kInterestingIntegers; }
std::span<const std::string_view> json_tokens() { return kJsonTokens; }

void mutate_bytes(Bytes& data, Rng& rng, std::span<const std::string_view> tokens) {
  const size_t size = data.size();
  switch (rng.below(tokens.empty() ? 8 : 9)) {
    case 0:
      if (size) data[rng.below(size)] ^= char(1u << rng.below(8));
      break;
    case 1: {
      constexpr uint8_t kBytes[] = {0x00, 0xff, 0x7f, 0x80, 0x01, 0xfe};
      if (size) data[rng.below(size)] = char(rng.pick(kBytes));
      break;
    }
    case 2: {
      const size_t width = size_t(1) << (1 + rng.below(3));  // 2, 4 or 8 bytes, little-endian
      if (size < width) break;
      const uint64_t value = rng.pick(interesting_integers());
      std::memcpy(data.data() + rng.below(size - width + 1), &value, width);
      break;
    }
    case 3:
      data.resize(rng.below(size + 1));
      break;
    case 4: {
      const size_t extra = rng.one_in(8) ? rng.below(4096) : rng.below(64);
      for (size_t i = 0; i < extra; ++i) data.push_back(char(rng.next()));
      break;
    }
    case 5: {
      if (!size) break;
      const size_t begin = rng.below(size), len = 1 + rng.below(std::min<size_t>(size - begin, 256));
      const std::string chunk = data.substr(begin, len);
      data.insert(rng.below(size + 1), chunk);
      break;
    }
    case 6: {
      if (!size) break;
      const size_t begin = rng.below(size);
      data.erase(begin, 1 + rng.below(std::min<size_t>(size - begin, 256)));
      break;
    }
    case 7: {
      if (!size) break;
      const size_t begin = rng.below(size), len = 1 + rng.below(std::min<size_t>(size - begin, 32));
      for (size_t i = 0; i < len; ++i) data[begin + i] = char(rng.next());
      break;
    }
    default:
      data.insert(rng.below(size + 1), rng.pick(tokens));
      break;
  }
  if (data.size() > kMaxInputBytes) data.resize(kMaxInputBytes);
}

std::optional<std::string> mutate_json(std::string_view text, Rng& rng) {
  if (nesting_depth(text) > 256) return std::nullopt;
  json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return std::nullopt;

  std::vector<json*> nodes{&root};
  for (size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i]->is_structured())
      for (json& child : *nodes[i]) nodes.push_back(&child);
  json& node = *nodes[rng.below(nodes.size())];

  std::string raw;  // when set, replaces the node's text verbatim
  switch (rng.below(9)) {
    case 0: node = interesting_json_number(rng); break;
    case 1: node = nudged_number(node, rng); break;
    case 2: node = other_type(node, rng); break;
    case 3:
      if (node.is_object() && !node.empty())
        node.erase(std::string(std::next(node.begin(), std::ptrdiff_t(rng.below(node.size()))).key()));
      else if (node.is_array() && !node.empty())
        node.erase(rng.below(node.size()));
      else
        node = nullptr;
      break;
    case 4:
      if (node.is_object()) {
        node[std::string(rng.pick(kJsonKeys))] = interesting_json_number(rng);
      } else if (node.is_array()) {
        node.push_back(node.empty() ? interesting_json_number(rng) : json(node[rng.below(node.size())]));
      } else {
        node = json::array({node, node});
      }
      break;
    case 5:
      if (node.is_object() && !node.empty()) {
        const std::string key = std::next(node.begin(), std::ptrdiff_t(rng.below(node.size()))).key();
        json value = std::move(node[key]);
        node.erase(key);
        node[std::string(rng.pick(kJsonKeys))] = std::move(value);
      } else if (node.is_string()) {
        node = edited_string(node.get<std::string>(), rng);
      }
      break;
    case 6: raw = rng.pick(kRawNumbers); break;
    case 7: {
      // Deep nesting: parsers must reject it without recursing once per level.
      const size_t depth = size_t(1) << rng.below(18);
      raw = std::string(depth, '[') + dump_lenient(node) + std::string(depth, ']');
      break;
    }
    default:
      node = node.is_string() ? edited_string(node.get<std::string>(), rng) : std::to_string(rng.next());
      break;
  }
  if (raw.empty()) return dump_lenient(root, rng.one_in(4) ? 1 : -1);
  const std::string sentinel = "\x01zshard-fuzz-raw\x01";
  node = sentinel;
  std::string out = dump_lenient(root);
  const std::string quoted = json(sentinel).dump();
  out.replace(out.find(quoted), quoted.size(), raw);
  return out;
}

}  // namespace zshard::fuzz
