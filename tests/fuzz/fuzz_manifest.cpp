// Fuzzes read_manifest on mutated manifest.json files beside valid rank files, then what zshard does with
// a manifest that loads: verify_file (size and checksum), check_units, CheckpointReader reads across
// shards and padding, and export_checkpoint.
#include <climits>
#include <filesystem>

#include "shard/checkpoint_format.h"
#include "tests/fuzz/fuzz_support.h"

namespace zshard::fuzz {

namespace {

using nlohmann::json;

std::string checkpoint_dir(const std::string& workdir) { return workdir + "/ckpt"; }

// Set by prepare_manifest(): the rank files every manifest may list, and where generated manifests are
// written.
std::vector<CheckpointFile> g_rank_files;
std::string g_generator_dir;

std::vector<Manifest> seed_manifests() {
  std::vector<Manifest> seeds(4);
  seeds[0].step = 3;
  seeds[0].group_size = 2;
  seeds[0].units = {{"embed", {{"wte", {8, 4}, true}, {"wpe", {4, 4}, true}}},
                    {"block0", {{"ln.w", {4}, false}, {"fc.w", {4, 6}, true}}}};
  seeds[0].run = {{"model", "tiny"}, {"lr", 0.001}, {"data", {{"position", 123}}}};
  seeds[1].group_size = 3;  // 5 elements over 3 shards: the last shard is part padding
  seeds[1].units = {{"head", {{"proj.w", {5}, true}}}};
  seeds[2].step = 7;  // no units at all
  seeds[3].group_size = 2;
  seeds[3].units = {{"zero", {{"z", {0, 3}, false}, {"s", {}, false}}}};
  return seeds;
}

std::vector<Bytes> prepare_manifest(const std::string& workdir) {
  const std::string dir = checkpoint_dir(workdir);
  g_generator_dir = workdir + "/generated";
  std::filesystem::create_directories(dir);
  std::filesystem::create_directories(g_generator_dir);
  std::vector<Manifest> seeds = seed_manifests();

  // Rank file s holds shard s of every seed's units (their names differ), so each seed's manifest finds
  // its tensors in the same directory.
  int max_group = 1;
  for (const Manifest& m : seeds) max_group = std::max(max_group, m.group_size);
  std::vector<std::vector<float>> storage;
  g_rank_files.clear();
  for (int shard = 0; shard < max_group; ++shard) {
    std::vector<FlatLayout> layouts;
    std::vector<ShardState> states;
    for (const Manifest& m : seeds) {
      if (m.group_size <= shard) continue;
      for (const FlatLayout& layout : m.layouts()) {
        std::vector<float>& values = storage.emplace_back(size_t(layout.shard_numel()));
        for (size_t i = 0; i < values.size(); ++i) values[i] = 0.25f * float(shard) + 0.01f * float(i);
        layouts.push_back(layout);
        states.push_back({values.data(), values.data(), values.data()});
      }
    }
    g_rank_files.push_back(write_rank_file(dir, shard, layouts, states));
  }

  std::vector<Bytes> texts;
  for (Manifest& m : seeds) {
    m.files.assign(g_rank_files.begin(), g_rank_files.begin() + m.group_size);
    commit_manifest(dir, m);
    texts.push_back(read_file_bytes(dir + "/" + kManifestFile));
  }
  return texts;
}

// A self-consistent manifest from the real writer with random small units and shapes: it passes the
// layout cross-checks that random text edits almost never get past, so the checks behind them get tested
// (negative or zero dimensions, empty units, names that match the rank files or not).
Bytes generated_manifest(Rng& rng) {
  constexpr const char* kUnitNames[] = {"embed", "block0", "head", "zero", "unit"};
  constexpr const char* kParamNames[] = {"wte", "wpe", "ln.w", "fc.w", "proj.w", "z", "s"};
  constexpr int64_t kDims[] = {-3, -1, 0, 1, 2, 3, 4, 5, 6, 8};
  constexpr int kSteps[] = {0, 1, 3, 123456, INT_MAX};
  Manifest m;
  m.step = rng.pick(kSteps);
  m.group_size = 1 + int(rng.below(g_rank_files.size()));
  for (uint64_t u = rng.below(4); u > 0; --u) {
    UnitSpec& unit = m.units.emplace_back(UnitSpec{rng.pick(kUnitNames), {}});
    for (uint64_t p = 1 + rng.below(3); p > 0; --p) {
      Shape shape;
      for (uint64_t d = rng.below(4); d > 0; --d) shape.push_back(rng.pick(kDims));
      unit.params.push_back({rng.pick(kParamNames), shape, rng.one_in(2)});
    }
  }
  m.files.assign(g_rank_files.begin(), g_rank_files.begin() + m.group_size);
  m.run = {{"seed", rng.next()}};
  commit_manifest(g_generator_dir, m);
  return read_file_bytes(g_generator_dir + "/" + kManifestFile);
}

constexpr std::string_view kManifestTokens[] = {
    "\"zshard-checkpoint\"", "\"rank-00000.safetensors\"", "\"rank-00001.safetensors\"",
    "\"ffffffffffffffff\"", "\"-1\"", "\"0x10\"", "\"\"", "\"params\"", "\"shard_numel\""};

void mutate_manifest(Bytes& input, Rng& rng) {
  if (rng.one_in(6)) {
    input = generated_manifest(rng);
    return;
  }
  if (rng.below(4) != 0)
    if (std::optional<std::string> edited = mutate_json(input, rng)) {
      input = std::move(*edited);
      return;
    }
  mutate_bytes(input, rng, rng.one_in(2) ? std::span(kManifestTokens) : json_tokens());
}

// Reads every saved flat buffer of every unit through the resharding reader, padding included.
void read_all_shards(const std::string& dir, const Manifest& manifest) {
  CheckpointReader reader(dir, manifest);
  const std::vector<FlatLayout> layouts = manifest.layouts();
  for (size_t u = 0; u < layouts.size(); ++u) {
    const int64_t padded = layouts[u].padded_numel();
    if (uint64_t(padded) > kMaxInputBytes) continue;  // a buffer this large is not worth allocating here
    std::vector<float> values(static_cast<size_t>(padded));
    for (std::string_view kind : kShardKinds)
      attempt("CheckpointReader::read", [&] { reader.read(int(u), kind, 0, padded, values.data()); });
    const int64_t half = padded / 2;
    attempt("CheckpointReader::read", [&] { reader.read(int(u), "m", half, padded - half, values.data()); });
  }
}

bool exercise_manifest(const Bytes& input, const std::string& workdir) {
  const std::string dir = checkpoint_dir(workdir);
  write_file(dir + "/" + kManifestFile, input);
  const Manifest manifest = read_manifest(dir);
  for (const CheckpointFile& file : manifest.files) {
    attempt("verify_file", [&] { verify_file(dir, file, /*full=*/false); });
    attempt("verify_file", [&] { verify_file(dir, file, /*full=*/true); });
  }
  if (!attempt("check_units", [&] { check_units(dir, manifest, manifest.units); }))
    throw BadOutcome{"check_units rejects the manifest's own units"};
  attempt("export_checkpoint", [&] { export_checkpoint(dir, workdir + "/export.safetensors"); });
  read_all_shards(dir, manifest);
  return true;
}

}  // namespace

const ParserTarget& manifest_target() {
  static const ParserTarget target{"manifest", prepare_manifest, mutate_manifest,
                                    exercise_manifest};
  return target;
}

}  // namespace zshard::fuzz
