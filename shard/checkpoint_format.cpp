#include "shard/checkpoint_format.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>

#include "kernels/io/atomic_file.h"
#include "kernels/io/file_kind.h"
#include "kernels/io/checksum.h"
#include "kernels/io/file_json.h"

namespace zshard {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

std::string join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

std::string tensor_name(const UnitSpec& unit, std::string_view kind) {
  return unit.name + "." + std::string(kind);
}

json unit_to_json(const FlatLayout& layout) {
  json params = json::array();
  for (size_t i = 0; i < layout.spec().params.size(); ++i) {
    const ParamSpec& p = layout.spec().params[i];
    params.push_back({{"name", p.name}, {"shape", p.shape}, {"offset", layout.offset(int(i))},
                      {"weight_decay", p.weight_decay}});
  }
  return {{"name", layout.spec().name}, {"numel", layout.numel()}, {"padded_numel", layout.padded_numel()},
          {"shard_numel", layout.shard_numel()}, {"params", params}};
}

// Manifest values arrive from a file: refuse what nlohmann would convert with undefined behaviour (a float
// or an out-of-range integer cast to int), dimensions whose product overflows, and names holding control
// characters, which would break the one-line error messages that quote them. Messages name a bad value by
// its type unless it is a number: dumping arbitrary JSON can recurse as deep as the file nests.
constexpr int64_t kMaxManifestNumel = int64_t(1) << 48;

std::string describe(const json& v) { return v.is_number() ? v.dump() : std::string(v.type_name()); }

int64_t integer_field(const json& j, const char* key, int64_t lo, int64_t hi) {
  const json& v = j.at(key);
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) ||
      v.get<int64_t>() < lo || v.get<int64_t>() > hi)
    throw std::runtime_error(std::string(key) + " " + describe(v) + " is not an integer in [" +
                             std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v.get<int64_t>();
}

std::string name_field(const json& j, const char* key) {
  std::string name = j.at(key).get<std::string>();
  if (has_control_character(name))
    throw std::runtime_error(std::string(key) + " " + json(name).dump() + " holds a control character");
  return name;
}

Shape shape_field(const json& p, int64_t& unit_numel) {
  const json& shape = p.at("shape");
  if (!shape.is_array()) throw std::runtime_error("shape is " + describe(shape) + ", not an array");
  Shape out;
  int64_t numel = 1;
  for (const json& d : shape) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t(kMaxManifestNumel) ||
        __builtin_mul_overflow(numel, int64_t(d.get<uint64_t>()), &numel) || numel > kMaxManifestNumel)
      throw std::runtime_error("shape is not a list of non-negative dimensions with a product below 2^48");
    out.push_back(d.get<int64_t>());
  }
  if ((unit_numel += numel) > kMaxManifestNumel) throw std::runtime_error("unit larger than 2^48 elements");
  return out;
}

// Parses the manifest's JSON; nlohmann's messages name the missing key or the wrong type.
Manifest manifest_from_json(const json& j) {
  // Another format or version is a file this zshard does not read (zshard::Error), not a damaged one.
  if (j.at("format").get<std::string>() != "zshard-checkpoint") fail("format is not zshard-checkpoint");
  const int64_t version = integer_field(j, "version", INT64_MIN, INT64_MAX);
  if (version != 1 && version != kCheckpointVersion)
    fail("version ", j.at("version").dump(), " is not 1 or ", kCheckpointVersion);
  const Checksum kind = version == 1 ? Checksum::fnv1a64 : Checksum::xxh3_64;
  Manifest m;
  m.step = int(integer_field(j, "step", 0, INT_MAX));
  m.group_size = int(integer_field(j, "group_size", 1, INT_MAX));
  // Absent from checkpoints saved before unequal shard groups: those padded to the group size.
  m.pad_multiple = j.contains("pad_multiple") ? int(integer_field(j, "pad_multiple", 1, INT_MAX)) : m.group_size;
  if (m.pad_multiple % m.group_size != 0)
    throw std::runtime_error("pad_multiple " + std::to_string(m.pad_multiple) + " is not a multiple of group_size " +
                             std::to_string(m.group_size));
  for (const json& u : j.at("units")) {
    UnitSpec spec{name_field(u, "name"), {}};
    int64_t unit_numel = 0;
    for (const json& p : u.at("params")) {
      std::string name = name_field(p, "name");
      Shape shape = shape_field(p, unit_numel);
      spec.params.push_back({std::move(name), std::move(shape), p.at("weight_decay").get<bool>()});
    }
    // The recorded offsets and sizes must be what the layout computes: a hand-edited or foreign
    // manifest would otherwise read the wrong bytes.
    const FlatLayout layout(spec, m.group_size, m.pad_multiple);
    if (u != unit_to_json(layout)) throw std::runtime_error("unit " + spec.name + ": inconsistent layout");
    m.units.push_back(std::move(spec));
  }
  const json& files = j.at("files");
  if (files.size() != size_t(m.group_size))
    throw std::runtime_error(std::to_string(files.size()) + " files listed for " +
                             std::to_string(m.group_size) + " shards");
  for (size_t s = 0; s < files.size(); ++s) {
    const json& f = files[s];
    if (integer_field(f, "shard", 0, INT64_MAX) != int64_t(s))
      throw std::runtime_error("files are not in shard order");
    if (!f.at("bytes").is_number_unsigned()) throw std::runtime_error("bytes is not a non-negative integer");
    CheckpointFile cf{name_field(f, "name"), f.at("bytes").get<uint64_t>(), 0, kind};
    if (cf.name != rank_file_name(int(s))) throw std::runtime_error("unexpected file name " + cf.name);
    const std::string digest = f.at(checksum_name(kind)).get<std::string>();
    if (digest.empty() || digest.size() > 16 ||
        !std::all_of(digest.begin(), digest.end(), [](unsigned char c) { return std::isxdigit(c); }))
      throw std::runtime_error(std::string("the ") + checksum_name(kind) + " of " + cf.name +
                               " is not 1 to 16 hexadecimal digits");
    cf.checksum = std::stoull(digest, nullptr, 16);
    m.files.push_back(std::move(cf));
  }
  m.run = j.at("run");
  if (j.contains("frozen")) {
    const json& f = j.at("frozen");
    m.frozen = {name_field(f, "source"), name_field(f, "fingerprint"), integer_field(f, "params", 1, INT64_MAX)};
  }
  return m;
}

json manifest_to_json(const Manifest& m) {
  json units = json::array(), files = json::array();
  for (const FlatLayout& layout : m.layouts()) units.push_back(unit_to_json(layout));
  for (size_t s = 0; s < m.files.size(); ++s) {
    // A manifest is written in the current version only: its checksums must be that version's.
    ZS_CHECK(m.files[s].kind == Checksum::xxh3_64, m.files[s].name, ": a ", checksum_name(m.files[s].kind),
             " checksum in a version ", kCheckpointVersion, " manifest");
    files.push_back({{"name", m.files[s].name}, {"shard", s}, {"bytes", m.files[s].bytes},
                     {checksum_name(Checksum::xxh3_64), hex(m.files[s].checksum)}});
  }
  json j = {{"format", "zshard-checkpoint"}, {"version", kCheckpointVersion}, {"step", m.step},
            {"group_size", m.group_size}, {"pad_multiple", m.pad_multiple == 0 ? m.group_size : m.pad_multiple}, {"units", units}, {"files", files}, {"run", m.run}};
  if (m.frozen.params > 0)
    j["frozen"] = {{"source", m.frozen.source}, {"fingerprint", m.frozen.fingerprint}, {"params", m.frozen.params}};
  return j;
}

}  // namespace

const char* checksum_name(Checksum kind) { return kind == Checksum::fnv1a64 ? "fnv1a64" : "xxh3_64"; }

uint64_t fnv1a64(const void* data, size_t n, uint64_t hash) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) hash = (hash ^ p[i]) * 0x100000001b3ull;
  return hash;
}

namespace {

// Calls `consume` on the bytes of the file at `path`, a chunk at a time; throws naming the file.
void read_chunks(const std::string& path, const std::function<void(const char*, size_t)>& consume) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, ": cannot open (", std::strerror(errno), ")");
  std::vector<char> buf(1 << 20);
  for (;;) {
    const ssize_t got = ::read(fd, buf.data(), buf.size());
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int err = errno;
      ::close(fd);
      fail(path, ": cannot read (", std::strerror(err), ")");
    }
    if (got == 0) break;
    consume(buf.data(), size_t(got));
  }
  ::close(fd);
}

}  // namespace

uint64_t file_checksum(const std::string& path, Checksum kind) {
  if (kind == Checksum::fnv1a64) {
    uint64_t hash = fnv1a64(nullptr, 0);
    read_chunks(path, [&](const char* data, size_t n) { hash = fnv1a64(data, n, hash); });
    return hash;
  }
  Xxh3Stream hash;
  read_chunks(path, [&](const char* data, size_t n) { hash.update(data, n); });
  return hash.digest();
}

std::string rank_file_name(int shard) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.safetensors", shard);
  return buf;
}

std::string step_dir_name(int step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08d", step);
  return buf;
}

std::optional<int> step_of_dir(const std::string& dir) {
  fs::path named = fs::path(dir).lexically_normal();
  if (named.filename().empty()) named = named.parent_path();  // "step-00000010/"
  const std::string name = named.filename().string();
  int step = -1;
  char tail = 0;
  if (std::sscanf(name.c_str(), "step-%d%c", &step, &tail) != 1 || step < 0 || name != step_dir_name(step))
    return std::nullopt;
  return step;
}

std::vector<FlatLayout> Manifest::layouts() const {
  std::vector<FlatLayout> out;
  for (const UnitSpec& u : units) out.emplace_back(u, group_size, pad_multiple);
  return out;
}

Manifest read_manifest(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    fail(dir, fs::exists(dir, ec) ? ": not a checkpoint (a file, not a checkpoint's directory)"
                                  : ": not a checkpoint (no such directory)");
  const std::string path = join(dir, kManifestFile);
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status))
    fail(dir, ": not a checkpoint (no ", kManifestFile, "; an interrupted save leaves none)");
  // Opening a FIFO would wait for a writer, before any collective and its deadline.
  if (const std::string_view kind = unreadable_kind(status.type()); !kind.empty())
    damaged(path, ": is ", kind, ", not a manifest file");
  std::string text;
  {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) fail(path, ": cannot open (", std::strerror(errno), ")");
    char buf[1 << 16];
    for (size_t got; (got = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, got);
    std::fclose(f);
  }
  json j;
  try {
    // A manifest nests a few levels; the copies and comparisons below recurse once per level.
    j = parse_json_with_depth_limit(
        text, 64, [&] { damaged(path, ": not a valid zshard manifest (nested deeper than 64 levels)"); });
  } catch (const json::exception& e) {
    damaged(path, ": truncated or not JSON (", e.what(), ")");
  }
  Manifest m;
  try {
    m = manifest_from_json(j);
  } catch (const Error& e) {
    fail(path, ": not a zshard manifest this version reads (", e.what(), ")");
  } catch (const std::exception& e) {  // json::exception or a consistency check
    damaged(path, ": not a valid zshard manifest (", e.what(), ")");
  }
  // The directory's name is the step the newest-checkpoint search and zshard-run go by; the manifest's
  // is the step training resumes at (its schedule and data positions). They must be the same step.
  const std::optional<int> dir_step = step_of_dir(dir);
  if (dir_step && *dir_step != m.step)
    damaged(path, ": records step ", m.step, " in the directory of step ", *dir_step);
  return m;
}

void commit_manifest(const std::string& dir, const Manifest& manifest) {
  write_file_atomically(join(dir, kManifestFile), manifest_to_json(manifest).dump(1) + "\n");
}

bool is_committed(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(join(dir, kManifestFile), ec);
}

void verify_file(const std::string& dir, const CheckpointFile& file, bool full) {
  const std::string path = join(dir, file.name);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) damaged(path, ": missing (", std::strerror(errno), ")");
  if (uint64_t(st.st_size) != file.bytes)
    damaged(path, ": ", st.st_size, " bytes, the manifest records ", file.bytes, " (truncated or replaced)");
  if (!full) return;
  const uint64_t sum = file_checksum(path, file.kind);
  if (sum != file.checksum)
    damaged(path, ": checksum mismatch (", checksum_name(file.kind), " ", hex(sum), ", the manifest records ", hex(file.checksum),
         "): the file is corrupt");
}

void check_units(const std::string& dir, const Manifest& manifest, const std::vector<UnitSpec>& units) {
  const std::string path = join(dir, kManifestFile);
  // The units hold the trained parameters only: another model, or the same one with other parameters
  // frozen (--freeze, LoRA), which is bad input rather than a damaged file.
  if (manifest.units.size() != units.size())
    refuse(path, ": ", manifest.units.size(), " units, the model has ", units.size());
  const auto names = [](const UnitSpec& unit) {
    std::set<std::string> out;
    for (const ParamSpec& p : unit.params) out.insert(p.name);
    return out;
  };
  for (size_t u = 0; u < units.size(); ++u) {
    const UnitSpec& saved = manifest.units[u];
    const UnitSpec& want = units[u];
    bool same = saved.name == want.name && saved.params.size() == want.params.size();
    for (size_t i = 0; same && i < want.params.size(); ++i)
      same = saved.params[i].name == want.params[i].name && saved.params[i].shape == want.params[i].shape;
    if (same) continue;
    if (saved.name == want.name) {
      const std::set<std::string> trained = names(saved), trains = names(want);
      for (const ParamSpec& p : saved.params)
        if (!trains.count(p.name))
          refuse(path, ": the checkpoint trained ", p.name, ", which this run freezes (--freeze and the LoRA ",
                 "flags must be as when it was saved)");
      for (const ParamSpec& p : want.params)
        if (!trained.count(p.name))
          refuse(path, ": this run trains ", p.name, ", which the checkpoint froze (--freeze and the LoRA flags ",
                 "must be as when it was saved)");
    }
    refuse(path, ": unit ", u, " (", saved.name, ") has other parameters than the model's ", want.name);
  }
}

CheckpointFile write_rank_file(const std::string& dir, int shard, const std::vector<FlatLayout>& layouts,
                               const std::vector<ShardState>& units, SaveSliceSource* source) {
  ZS_CHECK(layouts.size() == units.size(), "rank file: ", layouts.size(), " layouts for ", units.size(),
           " units");
  std::vector<SafetensorsArray> arrays;
  for (size_t u = 0; u < units.size(); ++u) {
    const Shape shape{layouts[u].shard_numel()};
    const float* data[] = {units[u].params, units[u].m, units[u].v};
    for (size_t k = 0; k < std::size(kShardKinds); ++k)
      arrays.push_back({tensor_name(layouts[u].spec(), kShardKinds[k]), data[k], shape});
  }
  CheckpointFile file{rank_file_name(shard), 0, 0};
  const std::string path = join(dir, file.name);
  // The checksum is taken of the bytes as they are handed to the file, in the same pass as the write.
  // Reading the file back now would read those very bytes again from the page cache, at the cost of a
  // second pass over gigabytes; corruption on the disk shows at a later load, which verifies the checksum.
  file.checksum = save_safetensors(path, arrays, {{"format", "zshard-checkpoint-shard"}, {"shard", std::to_string(shard)}},
                                   source, Existing::overwrite);
  std::error_code ec;
  file.bytes = fs::file_size(path, ec);
  if (ec) fail(path, ": cannot stat (", ec.message(), ")");
  return file;
}

CheckpointReader::CheckpointReader(std::string dir, const Manifest& manifest)
    : dir_(std::move(dir)), files_(manifest.files), layouts_(manifest.layouts()) {}

const SafetensorsFile& CheckpointReader::file(int shard) {
  auto it = open_.find(shard);
  if (it != open_.end()) return it->second;
  SafetensorsFile f = SafetensorsFile::open(join(dir_, files_.at(shard).name));
  for (const FlatLayout& layout : layouts_) {
    for (std::string_view kind : kShardKinds) {
      const SafetensorsEntry& e = f.entry(tensor_name(layout.spec(), kind));
      if (e.dtype != "F32" || e.shape != Shape{layout.shard_numel()})
        damaged(f.path(), ": tensor ", e.name, " is ", e.dtype, " ", shape_str(e.shape),
             ", the manifest needs F32 [", layout.shard_numel(), "]");
    }
  }
  return open_.emplace(shard, std::move(f)).first->second;
}

void CheckpointReader::read(int unit, std::string_view kind, int64_t begin, int64_t count, float* dst) {
  const FlatLayout& layout = layouts_.at(unit);
  const int64_t end = begin + count, real_end = std::clamp(layout.numel(), begin, end);
  const int64_t shard = layout.shard_numel();
  const std::string name = tensor_name(layout.spec(), kind);
  for (int64_t pos = begin; pos < real_end;) {
    const int64_t s = pos / shard, hi = std::min(real_end, (s + 1) * shard);
    file(int(s)).read_f32_range(name, pos - s * shard, hi - pos, dst + (pos - begin));
    pos = hi;
  }
  std::fill(dst + (real_end - begin), dst + count, 0.0f);
}

std::vector<CheckpointEntry> list_checkpoints(const std::string& save_dir) {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  if (!fs::is_directory(save_dir, ec)) return out;
  for (const auto& entry : fs::directory_iterator(save_dir, ec)) {
    const std::optional<int> step = step_of_dir(entry.path().string());
    if (!entry.is_directory(ec) || !step) continue;
    out.push_back({*step, entry.path().string(), is_committed(entry.path().string())});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return out;
}

std::optional<CheckpointEntry> newest_committed(const std::string& save_dir) {
  std::optional<CheckpointEntry> newest;
  for (const CheckpointEntry& e : list_checkpoints(save_dir))
    if (e.committed) newest = e;
  return newest;
}

namespace {

// The slices save_safetensors writes, from one unit's values at a time: the unit of the slice asked for
// is taken, and the one before it dropped, when the file reaches its first tensor.
class UnitByUnit final : public SaveSliceSource {
 public:
  UnitByUnit(const std::vector<UnitSpec>& units, const UnitValues& unit_values)
      : units_(units), unit_values_(unit_values) {
    for (size_t u = 0; u < units.size(); ++u) {
      const FlatLayout layout(units[u], 1);
      for (size_t i = 0; i < units[u].params.size(); ++i) tensors_.push_back({int(u), layout.offset(int(i))});
    }
  }
  std::vector<SafetensorsArray> arrays() const {  // their values from take()
    std::vector<SafetensorsArray> arrays;
    for (const UnitSpec& unit : units_)
      for (const ParamSpec& p : unit.params) arrays.push_back({p.name, nullptr, p.shape});
    return arrays;
  }
  const float* take(size_t tensor, int64_t begin, int64_t) override {
    const auto [unit, offset] = tensors_[tensor];
    while (taken_ < unit) {
      values_ = FlatValues();  // before the next unit is made: one at a time
      values_ = unit_values_(++taken_);
      const int64_t numel = FlatLayout(units_[size_t(taken_)], 1).numel();
      ZS_CHECK(int64_t(values_.size()) >= numel, "unit ", units_[size_t(taken_)].name, ": ", values_.size(),
               " elements, the layout needs ", numel);
    }
    return values_.data() + offset + begin;
  }
  void done(size_t, int64_t) override {}
  // The units no tensor reached (every one of them empty): taken all the same, as the caller counts on.
  void take_the_rest() {
    while (taken_ + 1 < int(units_.size())) unit_values_(++taken_);
  }

 private:
  const std::vector<UnitSpec>& units_;
  const UnitValues& unit_values_;
  std::vector<std::pair<int, int64_t>> tensors_;  // per tensor: its unit, and its offset in the unit's values
  int taken_ = -1;
  FlatValues values_;
};

// Each unit's saved parameters, whole (the params tensors only, never the Adam state), from a reader made
// once every rank file's checksum is verified. `manifest` must outlive the reads.
UnitValues verified_unit_params(const std::string& dir, const Manifest& manifest) {
  for (const CheckpointFile& f : manifest.files) verify_file(dir, f, /*full=*/true);
  const auto reader = std::make_shared<CheckpointReader>(dir, manifest);
  return [reader, &manifest](int unit) {
    FlatValues values(size_t(manifest.units[size_t(unit)].numel()));
    reader->read(unit, "params", 0, int64_t(values.size()), values.data());
    return values;
  };
}

}  // namespace

void save_consolidated(const std::string& path, const std::vector<UnitSpec>& units, const UnitValues& unit_values) {
  UnitByUnit source(units, unit_values);
  save_safetensors(path, source.arrays(), {{"format", "pt"}, {"producer", "zshard"}}, &source);
  source.take_the_rest();
}

std::vector<FlatValues> read_checkpoint_params(const std::string& dir, const Manifest& manifest) {
  const UnitValues unit_params = verified_unit_params(dir, manifest);
  std::vector<FlatValues> flat_units;
  for (size_t u = 0; u < manifest.units.size(); ++u) flat_units.push_back(unit_params(int(u)));
  return flat_units;
}

void export_checkpoint(const std::string& dir, const std::string& out_path) {
  const Manifest manifest = read_manifest(dir);
  save_consolidated(out_path, manifest.units, verified_unit_params(dir, manifest));
}

int64_t checkpoint_snapshot_bytes(const std::vector<FlatLayout>& layouts, int group) {
  if (group != 0) return 0;
  int64_t floats = 0;
  for (const FlatLayout& layout : layouts) floats += kStateKinds * layout.shard_numel();
  return floats * int64_t(sizeof(float));
}

}  // namespace zshard
