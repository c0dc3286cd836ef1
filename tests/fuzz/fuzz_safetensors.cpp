// Fuzzes SafetensorsFile: open() on mutated files, then every read a loader makes on what opened (names,
// metadata, entry, whole and partial f32 reads of every dtype) and the reads that must fail (unknown
// names, ranges past the end, a wrong expected shape).
#include <cstring>
#include <nlohmann/json.hpp>

#include "kernels/io/safetensors.h"
#include "tests/fuzz/fuzz_support.h"

namespace zshard::fuzz {

namespace {

using nlohmann::json;

struct SeedTensor {
  std::string name;
  std::string dtype;
  Shape shape;
  size_t elem_bytes;
};

// A file in the format's layout with deterministic, finite tensor contents.
Bytes build_file(const std::vector<SeedTensor>& tensors, const json& metadata, bool pad_header) {
  json header = json::object();
  std::string data;
  for (const SeedTensor& t : tensors) {
    const size_t bytes = size_t(shape_numel(t.shape)) * t.elem_bytes;
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + bytes}}};
    for (size_t i = 0; i < bytes; ++i) {
      // Low bytes cycle, high bytes stay small: every F16/BF16/F32/F64 pattern is a finite number.
      const bool high_byte = i % t.elem_bytes == t.elem_bytes - 1;
      data.push_back(char(high_byte ? 0x3c : uint8_t(i * 37)));
    }
  }
  if (!metadata.is_null()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  if (pad_header) text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_len = text.size();
  Bytes file(reinterpret_cast<const char*>(&header_len), 8);
  return file + text + data;
}

std::vector<Bytes> prepare_safetensors(const std::string& workdir) {
  std::vector<Bytes> seeds;
  seeds.push_back(build_file({{"w", "F32", {2, 3}, 4}, {"b", "F16", {4}, 2}, {"g", "BF16", {2, 2}, 2}},
                             {{"format", "pt"}, {"producer", "zshard"}}, true));
  seeds.push_back(build_file({{"model.wte.weight", "F64", {3}, 8}, {"ids", "I32", {2}, 4},
                              {"empty", "U8", {0, 5}, 1}, {"scalar", "F32", {}, 4}},
                             nullptr, false));
  seeds.push_back(build_file({}, json::object(), true));
  // And one from the real writer, so the fuzzer starts from exactly what zshard saves.
  const std::vector<float> values = {0.5f, -1.25f, 3.0f, 0.0f, 1e-3f, -7.5f};
  const std::string saved = workdir + "/seed.safetensors";
  save_safetensors(saved, {{"transformer.h.0.attn.c_attn.weight", values.data(), {2, 3}},
                           {"transformer.ln_f.bias", values.data(), {6}}},
                   {{"format", "pt"}});
  seeds.push_back(read_file_bytes(saved));
  return seeds;
}

constexpr std::string_view kSafetensorsTokens[] = {
    "\"F32\"", "\"F16\"", "\"BF16\"", "\"F64\"", "\"I64\"", "\"BOOL\"", "\"F8_E4M3\"", "\"__metadata__\"",
    "\"dtype\"", "\"shape\"", "\"data_offsets\"", "[0,0]", "[18446744073709551615,0]"};

// The header length field is what every other offset hangs on: set it to the values around the truth.
void mutate_header_length(Bytes& input, Rng& rng) {
  if (input.size() < 8) return;
  uint64_t header_len;
  std::memcpy(&header_len, input.data(), 8);
  const uint64_t after_field = input.size() - 8;
  const uint64_t choices[] = {0, 1, 2, header_len - 1, header_len + 1, after_field, after_field + 1,
                              header_len / 2, rng.pick(interesting_integers())};
  const uint64_t value = rng.pick(choices);
  std::memcpy(input.data(), &value, 8);
}

// Edits the JSON header and re-frames it, so the edit reaches the header checks instead of stopping at
// the length field.
bool mutate_header_json(Bytes& input, Rng& rng) {
  if (input.size() < 8) return false;
  uint64_t header_len;
  std::memcpy(&header_len, input.data(), 8);
  if (header_len > input.size() - 8) return false;
  std::optional<std::string> header = mutate_json(std::string_view(input).substr(8, header_len), rng);
  if (!header) return false;
  const uint64_t new_len = header->size();
  Bytes out(reinterpret_cast<const char*>(&new_len), 8);
  input = out + *header + input.substr(8 + header_len);
  return true;
}

// Non-finite values must be refused by the reads, wherever they sit in the data.
void plant_non_finite(Bytes& input, Rng& rng) {
  constexpr uint32_t kPatterns[] = {0x7fc00000u, 0x7f800000u, 0xff800000u, 0x7c007c00u, 0xfc00fc00u,
                                    0x7e007e00u, 0xff80ff80u};
  if (input.size() < 4) return;
  const uint32_t pattern = rng.pick(kPatterns);
  std::memcpy(input.data() + rng.below(input.size() - 3), &pattern, 4);
}

void mutate_safetensors(Bytes& input, Rng& rng) {
  switch (rng.below(8)) {
    case 0:
    case 1:
    case 2:
      if (mutate_header_json(input, rng)) return;
      break;
    case 3: mutate_header_length(input, rng); return;
    case 4: plant_non_finite(input, rng); return;
    default: break;
  }
  mutate_bytes(input, rng, rng.one_in(2) ? std::span(kSafetensorsTokens) : json_tokens());
}

// What a loader does with an opened file; every read may fail cleanly (non-finite data, non-float dtype)
// but must not crash, and the documented failures must happen.
void read_everything(const SafetensorsFile& file) {
  const std::vector<std::string> names = file.names();
  for (size_t i = 0; i < names.size(); ++i)
    if (!file.contains(names[i]) || (i > 0 && !(names[i - 1] < names[i])))
      throw BadOutcome{"names() is not the sorted list of contained tensors"};

  for (const std::string& name : names) {
    const SafetensorsEntry entry = file.entry(name);
    const int64_t numel = entry.numel();
    // An opened entry's bytes lie inside the file, so its element count is bounded by the input size.
    if (numel < 0 || uint64_t(numel) > kMaxInputBytes || entry.begin > entry.end)
      throw BadOutcome{"entry '" + name + "' opened with numel " + std::to_string(numel) + " and offsets [" +
                       std::to_string(entry.begin) + ", " + std::to_string(entry.end) + ")"};
    std::vector<float> values(size_t(numel) + 1);
    attempt("read_f32", [&] { file.read_f32(name, values.data(), entry.shape); });
    const int64_t half = numel / 2;
    attempt("read_f32_range", [&] { file.read_f32_range(name, half, numel - half, values.data()); });
    attempt("read_f32_range", [&] { file.read_f32_range(name, numel, 0, values.data()); });
    expect_error("read_f32_range past the end",
                 [&] { file.read_f32_range(name, half, numel - half + 1, values.data()); });
    expect_error("read_f32_range before the start", [&] { file.read_f32_range(name, -1, 1, values.data()); });
    Shape wrong = entry.shape;
    wrong.push_back(1);
    expect_error("read_f32 with a wrong shape", [&] { file.read_f32(name, values.data(), wrong); });
  }
  expect_error("entry of an unknown name", [&] { file.entry("no such tensor \x01"); });
}

bool exercise_safetensors(const Bytes& input, const std::string& workdir) {
  const std::string path = workdir + "/input.safetensors";
  write_file(path, input);
  const SafetensorsFile file = SafetensorsFile::open(path);
  read_everything(file);
  return true;
}

}  // namespace

const ParserTarget& safetensors_target() {
  static const ParserTarget target{"safetensors", prepare_safetensors, mutate_safetensors,
                                    exercise_safetensors};
  return target;
}

}  // namespace zshard::fuzz
