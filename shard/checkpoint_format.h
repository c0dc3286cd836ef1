// Checkpoint format: a directory holding one safetensors file per saved shard plus manifest.json,
// written last. Rank file `rank-0000S.safetensors` holds shard S of every unit as three 1-D F32
// tensors "<unit>.params", "<unit>.m", "<unit>.v" (shard_numel elements each, padding included). The
// saved flat buffer of a unit is the concatenation of all its shards, so resharding to any other
// group size is index arithmetic over FlatLayout: a target rank reads only the byte ranges of the
// rank files that overlap its new shard.
//
// Commit protocol: rank files are written under temporary names, fsynced and renamed; after a barrier
// the manifest is written to a temporary file, fsynced, renamed and the directory fsynced. A
// directory without manifest.json is not a checkpoint.
#pragma once
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/io/safetensors.h"
#include "shard/flat_unit.h"

namespace zshard {

constexpr const char* kManifestFile = "manifest.json";
// Version 2 checksums its rank files with XXH3-64; version 1 (FNV-1a 64) is still read.
constexpr int kCheckpointVersion = 2;
// The per-unit tensors of a rank file.
constexpr std::string_view kShardKinds[] = {"params", "m", "v"};
constexpr int kStateKinds = int(std::size(kShardKinds));

// What catches a torn or corrupted rank file. A save hashes every byte as it writes it: XXH3-64 (xxHash,
// compiled in from its header) does that at several GB/s, where version 1's bytewise FNV-1a 64 managed
// 0.7 and cost a gpt2 rank a second of CPU per save.
enum class Checksum { fnv1a64, xxh3_64 };
const char* checksum_name(Checksum kind);  // the manifest's key: "fnv1a64", "xxh3_64"
uint64_t fnv1a64(const void* data, size_t n, uint64_t hash = 0xcbf29ce484222325ull);
// Streams the file; throws naming it.
uint64_t file_checksum(const std::string& path, Checksum kind = Checksum::xxh3_64);

std::string rank_file_name(int shard);
std::string step_dir_name(int step);  // "step-00000042": sorts by step
std::optional<int> step_of_dir(const std::string& dir);  // 42 for ".../step-00000042[/]", else none

struct CheckpointFile {
  std::string name;  // relative to the checkpoint directory
  uint64_t bytes = 0;
  uint64_t checksum = 0;
  Checksum kind = Checksum::xxh3_64;  // fnv1a64 in a version 1 checkpoint
};

// What the manifest says about the layout and the files; `run` carries the trainer's state and
// options (model config, strategy, schedule and data position), which this layer does not interpret.
struct Manifest {
  int step = 0;
  int group_size = 1;           // shards per unit in the saved layout = rank files
  int pad_multiple = 0;         // units padded to a multiple of this (FlatLayout); 0: group_size
  std::vector<UnitSpec> units;  // in model order
  std::vector<CheckpointFile> files;  // files[s] holds shard s
  nlohmann::json run = nlohmann::json::object();
  // The frozen parameters the saved state was trained beside, which the checkpoint does not hold
  // (shard/frozen_fingerprint.h); params 0: none were frozen.
  struct Frozen {
    std::string source;       // "seed 1337", or the weights file imported
    std::string fingerprint;  // frozen_fingerprint()
    int64_t params = 0;
  } frozen;

  std::vector<FlatLayout> layouts() const;
};

// Reads and validates DIR/manifest.json; errors name the file and what is wrong with it.
Manifest read_manifest(const std::string& dir);
// Writes DIR/manifest.json through a temporary file, fsync and rename: the commit point.
void commit_manifest(const std::string& dir, const Manifest& manifest);
bool is_committed(const std::string& dir);

// Checks that the file exists with the recorded size (cheap) or, with `full`, also its checksum.
void verify_file(const std::string& dir, const CheckpointFile& file, bool full);
// Every parameter of `units` (the model's) matches the manifest's by name, shape and order.
void check_units(const std::string& dir, const Manifest& manifest, const std::vector<UnitSpec>& units);

// One shard's state of one unit: shard_numel floats each.
struct ShardState {
  const float* params;
  const float* m;
  const float* v;
};
// Writes the rank file of `shard` (temp name, fsync, rename) and returns its size and checksum. The
// file holds params, m and v of every unit in turn: tensor 3u + k of `source`, which (when given) hands
// out the values in place of `units`. A rank file already in `dir` is written over: the directory is an
// uncommitted save's (prepare_step_dir), so what it holds is dead.
CheckpointFile write_rank_file(const std::string& dir, int shard, const std::vector<FlatLayout>& layouts,
                               const std::vector<ShardState>& units, SaveSliceSource* source = nullptr);

// Reads ranges of the saved flat buffers, opening only the rank files a range touches.
class CheckpointReader {
 public:
  CheckpointReader(std::string dir, const Manifest& manifest);
  // Elements [begin, begin + count) of `unit`'s saved flat buffer of `kind` ("params", "m", "v")
  // into dst; positions past the real elements (padding of any layout) read as 0.
  void read(int unit, std::string_view kind, int64_t begin, int64_t count, float* dst);

 private:
  const SafetensorsFile& file(int shard);

  std::string dir_;
  std::vector<CheckpointFile> files_;
  std::vector<FlatLayout> layouts_;
  std::map<int, SafetensorsFile> open_;
};

struct CheckpointEntry {
  int step;
  std::string path;
  bool committed;
};
// The step-* directories of a save directory, oldest first (none if it does not exist).
std::vector<CheckpointEntry> list_checkpoints(const std::string& save_dir);
// The newest committed one: what --resume latest loads (and zshard-run sets aside when it is damaged).
std::optional<CheckpointEntry> newest_committed(const std::string& save_dir);

// A unit's full flat buffer (FlatLayout(unit, 1)): gathered from its shards, or read from a checkpoint.
using UnitValues = std::function<FlatValues(int unit)>;
// Writes every parameter (the model's names and shapes, F32), taking each unit's values from `unit_values`
// as the file reaches them and dropping them before the next unit's: the writer holds one unit, never the
// model. `unit_values` is called once per unit, in order; when the write fails, not for the units after
// the one it failed in (a caller whose calls are collective makes those itself).
void save_consolidated(const std::string& path, const std::vector<UnitSpec>& units, const UnitValues& unit_values);
// The parameters a checkpoint holds, once every rank file's checksum is verified: a full flat buffer per
// unit of manifest.units (FlatLayout(unit, 1)). Only the params tensors are read, never the Adam state.
std::vector<FlatValues> read_checkpoint_params(const std::string& dir, const Manifest& manifest);
// Writes the parameters the checkpoint holds consolidated, once every rank file's checksum is verified,
// reading one unit at a time.
void export_checkpoint(const std::string& dir, const std::string& out_path);

// Host bytes of the snapshot a rank of shard group `group` holds at most: all of it for state on a
// device, what training overtakes for state in host memory. The first group's ranks write, the others
// hold none.
int64_t checkpoint_snapshot_bytes(const std::vector<FlatLayout>& layouts, int group);

}  // namespace zshard
