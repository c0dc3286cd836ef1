// The checkpoint format on its own: resharding reads between any saved and any target group size, the
// manifest round trip, the commit marker, and one clear error per kind of bad input. Then the
// SavePolicy's checks against the flags and --keep, in a single process.
#include "shard/checkpoint_format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>

#include <zshard/model_registry.h>

#include "comm/agreed_failure.h"
#include "comm/self_communicator.h"
#include "runtime/train/save_policy.h"
#include "tests/support/test_support.h"
#include "tests/support/training_runs.h"

namespace zshard {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using test::error_of;
using test::TempDir;

// Two units of 13 and 5 elements: sizes that no group size divides evenly.
std::vector<UnitSpec> toy_units() {
  return {{"a", {{"a.w", {3, 3}, true}, {"a.b", {4}, false}}}, {"b", {{"b.g", {5}, false}}}};
}

// Saved value of element e of unit u in tensor kind k: distinct everywhere.
float value(int u, int k, int64_t e) { return float(1000 * u + 100 * k + e + 1); }

// Writes a committed checkpoint of toy_units() cut into `group` shards.
Manifest write_toy(const std::string& dir, int group) {
  fs::create_directories(dir);
  Manifest m;
  m.step = 7;
  m.group_size = group;
  m.units = toy_units();
  m.run = {{"note", "toy"}};
  const std::vector<FlatLayout> layouts = m.layouts();
  for (int s = 0; s < group; ++s) {
    std::vector<std::vector<float>> store;
    std::vector<ShardState> states;
    for (size_t u = 0; u < layouts.size(); ++u) {
      for (int k = 0; k < 3; ++k) {
        std::vector<float> shard(size_t(layouts[u].shard_numel()), 0.0f);
        for (int64_t i = 0; i < layouts[u].shard_numel(); ++i) {
          const int64_t e = layouts[u].shard_begin(s) + i;
          if (e < layouts[u].numel()) shard[size_t(i)] = value(int(u), k, e);
        }
        store.push_back(std::move(shard));
      }
    }
    for (size_t u = 0; u < layouts.size(); ++u)
      states.push_back({store[3 * u].data(), store[3 * u + 1].data(), store[3 * u + 2].data()});
    m.files.push_back(write_rank_file(dir, s, layouts, states));
  }
  commit_manifest(dir, m);
  return m;
}

TEST(Checkpoint, ChecksumKnownValues) {
  EXPECT_EQ(fnv1a64("", 0), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a", 1), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a64("foobar", 6), 0x85944171f73967e8ull);
  TempDir tmp;
  std::ofstream(tmp.file("empty"));
  std::ofstream(tmp.file("foobar")) << "foobar";
  EXPECT_EQ(file_checksum(tmp.file("empty"), Checksum::xxh3_64), 0x2d06800538d394c2ull);  // xxHash's own
  EXPECT_EQ(file_checksum(tmp.file("empty"), Checksum::fnv1a64), 0xcbf29ce484222325ull);
  EXPECT_EQ(file_checksum(tmp.file("foobar"), Checksum::fnv1a64), 0x85944171f73967e8ull);
}

// A rank file's checksum is taken while it is written, a slice of 1 MiB at a time: it must equal the
// checksum of the file read back, over a unit that spans several slices; a NaN in a later slice still
// fails the save, naming its element, and leaves no file behind.
TEST(Checkpoint, ChecksumTakenWhileWritingIsTheFilesOwn) {
  TempDir tmp;
  const std::vector<FlatLayout> layouts{FlatLayout({"big", {{"big.w", {700001}, true}}}, 1)};
  const int64_t n = layouts[0].shard_numel();
  std::vector<float> params(static_cast<size_t>(n)), m(params), v(params);
  for (int64_t i = 0; i < n; ++i) {
    params[size_t(i)] = float(i % 977) * 0.5f;
    m[size_t(i)] = -float(i % 13);
    v[size_t(i)] = float(i % 7) + 0.25f;
  }
  const std::string dir = tmp.path().string();
  const CheckpointFile file = write_rank_file(dir, 0, layouts, {{params.data(), m.data(), v.data()}});
  EXPECT_EQ(file.checksum, file_checksum(tmp.file(file.name)));
  EXPECT_EQ(file.bytes, fs::file_size(tmp.file(file.name)));

  fs::remove(tmp.file(file.name));
  v[600000] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(error_of([&] { write_rank_file(dir, 0, layouts, {{params.data(), m.data(), v.data()}}); }),
              HasSubstr("holds a non-finite value (nan at element 600000)"));
  EXPECT_TRUE(fs::is_empty(tmp.path()));
}

// A version 1 checkpoint (FNV-1a 64 checksums) still reads and verifies, and its checksums still catch a
// flipped byte; a version this build does not know is refused.
TEST(Checkpoint, ReadsVersion1Checkpoints) {
  TempDir tmp;
  const std::string dir = tmp.file("step-00000007");
  write_toy(dir, 2);
  nlohmann::json j = nlohmann::json::parse(std::ifstream(dir + "/manifest.json"));
  EXPECT_EQ(j["version"], kCheckpointVersion);
  j["version"] = 1;
  for (nlohmann::json& f : j["files"]) {
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx",
                  (unsigned long long)file_checksum(dir + "/" + f["name"].get<std::string>(), Checksum::fnv1a64));
    f.erase("xxh3_64");
    f["fnv1a64"] = hex;
  }
  std::ofstream(dir + "/manifest.json") << j.dump(2);
  const Manifest m = read_manifest(dir);
  ASSERT_EQ(m.files.size(), 2u);
  for (const CheckpointFile& f : m.files) {
    EXPECT_EQ(f.kind, Checksum::fnv1a64);
    verify_file(dir, f, /*full=*/true);
  }
  {
    std::fstream f(dir + "/rank-00001.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  EXPECT_THAT(error_of([&] { verify_file(dir, m.files[1], true); }),
              AllOf(HasSubstr("rank-00001.safetensors"), HasSubstr("checksum mismatch (fnv1a64")));
  j["version"] = kCheckpointVersion + 1;
  std::ofstream(dir + "/manifest.json") << j.dump(2);
  EXPECT_THAT(error_of([&] { read_manifest(dir); }), HasSubstr("version 3 is not 1 or 2"));
  // Damage exits 3 (zshard-run sets the checkpoint aside); a version this zshard does not read is no damage.
  EXPECT_THROW(verify_file(dir, m.files[1], true), DamagedCheckpoint);
  try {
    read_manifest(dir);
    ADD_FAILURE() << "a manifest of another version read";
  } catch (const DamagedCheckpoint&) {
    ADD_FAILURE() << "another version taken for a damaged manifest";
  } catch (const Error&) {
  }
}

TEST(Checkpoint, ReadsEveryTargetLayoutFromEverySavedLayout) {
  TempDir tmp;
  for (int saved : {1, 2, 3, 5, 20}) {
    const std::string dir = tmp.file("g" + std::to_string(saved));
    write_toy(dir, saved);
    const Manifest m = read_manifest(dir);
    CheckpointReader reader(dir, m);
    for (int target : {1, 2, 3, 4, 16}) {
      for (size_t u = 0; u < m.units.size(); ++u) {
        const FlatLayout layout(m.units[u], target);
        for (int s = 0; s < target; ++s) {
          for (int k = 0; k < 3; ++k) {
            std::vector<float> got(size_t(layout.shard_numel()), -1.0f);
            reader.read(int(u), kShardKinds[k], layout.shard_begin(s), layout.shard_numel(), got.data());
            for (int64_t i = 0; i < layout.shard_numel(); ++i) {
              const int64_t e = layout.shard_begin(s) + i;
              EXPECT_EQ(got[size_t(i)], e < layout.numel() ? value(int(u), k, e) : 0.0f)
                  << "saved " << saved << " target " << target << " unit " << u << " element " << e;
            }
          }
        }
      }
    }
  }
}

// A rank of the new layout must read only the rank files its shard overlaps, not the whole checkpoint:
// with saved shards 2 and 3 of 4 gone, shard 0 of 2 (within saved shards 0 and 1) still reads.
TEST(Checkpoint, ReadsOnlyTheRankFilesItsShardOverlaps) {
  TempDir tmp;
  const std::string dir = tmp.file("g4");
  const Manifest m = write_toy(dir, 4);
  fs::remove(dir + "/rank-00002.safetensors");
  fs::remove(dir + "/rank-00003.safetensors");
  CheckpointReader reader(dir, m);
  for (size_t u = 0; u < m.units.size(); ++u) {
    const FlatLayout saved(m.units[u], 4), target(m.units[u], 2);
    ASSERT_LE(target.shard_numel(), 2 * saved.shard_numel()) << "shard 0 must lie within saved shards 0, 1";
    std::vector<float> got(size_t(target.shard_numel()));
    reader.read(int(u), "v", 0, target.shard_numel(), got.data());
    for (int64_t e = 0; e < target.shard_numel(); ++e) EXPECT_EQ(got[size_t(e)], value(int(u), 2, e));
  }
  // Shard 1 of unit a reaches into saved shard 2, and says which file it misses.
  const FlatLayout a(m.units[0], 2);
  std::vector<float> got(size_t(a.shard_numel()));
  EXPECT_THAT(error_of([&] { reader.read(0, "params", a.shard_begin(1), a.shard_numel(), got.data()); }),
              HasSubstr("rank-00002.safetensors"));
}

TEST(Checkpoint, ManifestRoundTripAndCommitMarker) {
  TempDir tmp;
  const Manifest written = write_toy(tmp.file("step-00000007"), 3);
  const Manifest read = read_manifest(tmp.file("step-00000007"));
  EXPECT_EQ(read.step, 7);
  EXPECT_EQ(read.group_size, 3);
  EXPECT_EQ(read.run, written.run);
  ASSERT_EQ(read.files.size(), 3u);
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_EQ(read.files[s].checksum, written.files[s].checksum);
    verify_file(tmp.file("step-00000007"), read.files[s], /*full=*/true);
  }
  // A directory without its manifest is not a checkpoint; other names are ignored.
  fs::create_directories(tmp.file("step-00000009"));
  fs::create_directories(tmp.file("step-12"));
  fs::create_directories(tmp.file("other"));
  const std::vector<CheckpointEntry> all = list_checkpoints(tmp.path().string());
  ASSERT_EQ(all.size(), 2u);
  EXPECT_TRUE(all[0].step == 7 && all[0].committed);
  EXPECT_TRUE(all[1].step == 9 && !all[1].committed);
  EXPECT_TRUE(list_checkpoints(tmp.file("missing")).empty());
  // The directory's step is the one searches go by; a manifest recording another was edited or moved.
  EXPECT_EQ(read_manifest(tmp.file("step-00000007/")).step, 7);
  fs::copy(tmp.file("step-00000007"), tmp.file("step-00000008"));
  EXPECT_THAT(error_of([&] { read_manifest(tmp.file("step-00000008")); }),
              HasSubstr("step-00000008/manifest.json: records step 7 in the directory of step 8"));
  EXPECT_THROW(read_manifest(tmp.file("step-00000008")), DamagedCheckpoint);
  fs::copy(tmp.file("step-00000007"), tmp.file("renamed"));
  EXPECT_EQ(read_manifest(tmp.file("renamed")).step, 7);  // a name that is no step's says nothing
}

TEST(Checkpoint, BadInputNamesTheFileAndTheProblem) {
  TempDir tmp;
  const std::string dir = tmp.file("ck");
  const Manifest m = write_toy(dir, 2);
  const std::string rank1 = dir + "/rank-00001.safetensors";

  EXPECT_THAT(error_of([&] { read_manifest(tmp.file("nope")); }),
              AllOf(HasSubstr("nope"), HasSubstr("not a checkpoint (no such directory)")));
  fs::create_directories(tmp.file("empty"));
  EXPECT_THAT(error_of([&] { read_manifest(tmp.file("empty")); }),
              AllOf(HasSubstr("empty"), HasSubstr("not a checkpoint (no manifest.json")));
  std::ofstream(tmp.file("a-file")) << "{}";
  EXPECT_THAT(error_of([&] { read_manifest(tmp.file("a-file")); }),
              HasSubstr("a-file: not a checkpoint (a file, not a checkpoint's directory)"));
  // A FIFO's open waited for a writer that never came.
  fs::create_directories(tmp.file("fifo"));
  ASSERT_EQ(mkfifo(tmp.file("fifo/manifest.json").c_str(), 0600), 0);
  EXPECT_THAT(error_of([&] { read_manifest(tmp.file("fifo")); }),
              HasSubstr("fifo/manifest.json: is a FIFO (named pipe), not a manifest file"));

  // Corrupt: same size, one byte flipped near the end (in the Adam state).
  fs::copy_file(rank1, tmp.file("keep"));
  {
    std::fstream f(rank1, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  EXPECT_THAT(error_of([&] { verify_file(dir, m.files[1], true); }),
              AllOf(HasSubstr("rank-00001.safetensors"), HasSubstr("checksum mismatch")));
  EXPECT_EQ(error_of([&] { verify_file(dir, m.files[1], false); }), "(no error)");  // size only
  fs::resize_file(rank1, fs::file_size(rank1) - 4);
  EXPECT_THAT(error_of([&] { verify_file(dir, m.files[1], false); }),
              AllOf(HasSubstr("rank-00001.safetensors"), HasSubstr("the manifest records")));
  fs::remove(rank1);
  EXPECT_THAT(error_of([&] { verify_file(dir, m.files[1], false); }),
              AllOf(HasSubstr("rank-00001.safetensors"), HasSubstr("missing")));
  fs::copy_file(tmp.file("keep"), rank1);
  verify_file(dir, m.files[1], true);

  // Truncated or inconsistent manifests.
  const std::string manifest = dir + "/manifest.json";
  std::string text;
  {
    std::ifstream in(manifest);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::ofstream(manifest) << text.substr(0, text.size() / 2);
  EXPECT_THAT(error_of([&] { read_manifest(dir); }),
              AllOf(HasSubstr("manifest.json"), HasSubstr("truncated or not JSON")));
  EXPECT_THROW(read_manifest(dir), DamagedCheckpoint);
  const auto pos = text.find("\"padded_numel\": 14");
  ASSERT_NE(pos, std::string::npos);
  std::ofstream(manifest) << text.substr(0, pos) << "\"padded_numel\": 16" << text.substr(pos + 18);
  EXPECT_THAT(error_of([&] { read_manifest(dir); }),
              AllOf(HasSubstr("manifest.json"), HasSubstr("unit a: inconsistent layout")));
  const auto digest = text.find("\"xxh3_64\": \"");
  ASSERT_NE(digest, std::string::npos);
  for (const std::string bad : {"zz", "-1", ""}) {
    const size_t at = digest + 12, end = text.find('"', at);
    std::ofstream(manifest) << text.substr(0, at) << bad << text.substr(end);
    EXPECT_THAT(error_of([&] { read_manifest(dir); }),
                HasSubstr("the xxh3_64 of rank-00000.safetensors is not 1 to 16 hexadecimal digits"))
        << "'" << bad << "'";
  }
}

// ---- the save policy in one process ----

struct Job {
  comm::SelfCommunicator self;
  std::unique_ptr<Trainer> trainer;
  std::unique_ptr<SavePolicy> checkpoints;
  explicit Job(const TrainOptions& o) {
    trainer = std::make_unique<Trainer>(o, self);
    checkpoints = std::make_unique<SavePolicy>(*trainer, nullptr);
  }
  void run() {
    trainer->run(nullptr, [&] { return checkpoints->after_step(); });
    checkpoints->save();
  }
};

std::string setup_error(const TrainOptions& o) {
  try {
    Job job(o);
  } catch (const AgreedFailure& e) {
    return e.what();
  }
  return "(no error)";
}

// The tiny GPT-2 with its position table frozen by the model itself (ParamSpec::frozen), no flag saying so.
class OwnFrozenPositions final : public Model {
 public:
  explicit OwnFrozenPositions(const ModelConfig& config) : inner_(build_model("tiny", config)) {}
  std::vector<UnitSpec> units() const override {
    std::vector<UnitSpec> units = inner_->units();
    for (ParamSpec& p : units[0].params) p.frozen = p.name == "wpe.weight";
    return units;
  }
  void init_unit(int unit, const UnitTensors& params, uint64_t seed) const override {
    inner_->init_unit(unit, params, seed);
  }
  double forward_backward(ParamContext& ctx, const Batch& batch, float loss_scale) override {
    return inner_->forward_backward(ctx, batch, loss_scale);
  }
  double forward(ParamContext& ctx, const Batch& batch) override { return inner_->forward(ctx, batch); }
  int64_t activation_bytes(int B, int T, DType dtype) const override { return inner_->activation_bytes(B, T, dtype); }
  int vocab_size() const override { return inner_->vocab_size(); }
  int context_length() const override { return inner_->context_length(); }

 private:
  std::unique_ptr<Model> inner_;
};

// Its frozen weights come from --init-from beside --resume, as a LoRA run's base does; where nothing is
// frozen the checkpoint holds every weight, and the two flags exclude each other.
TEST(SavePolicy, ResumeBesideInitFromWhereTheModelFreezesItsOwn) {
  register_model("tiny-own-frozen", model_config("tiny"),
                 [](const ModelConfig& config) { return std::make_unique<OwnFrozenPositions>(config); });
  TrainOptions o = test::tiny_options(1);
  o.saves.resume = "x";
  o.model.init_from = "missing.safetensors";
  EXPECT_THAT(setup_error(o), HasSubstr("--resume and --init-from exclude each other"));
  o.model.name = "tiny-own-frozen";
  EXPECT_THAT(setup_error(o), AllOf(HasSubstr("missing.safetensors"), Not(HasSubstr("exclude each other"))));
}

TEST(SavePolicy, FlagsNeedTheirCompanions) {
  const auto with = [](auto edit) {
    TrainOptions o = test::tiny_options(1);
    edit(o);
    return setup_error(o);
  };
  EXPECT_THAT(with([](TrainOptions& o) { o.saves.save_every = 2; }),
              HasSubstr("--save-every and --keep need --save-dir"));
  EXPECT_THAT(with([](TrainOptions& o) { o.saves.resume = "latest"; }),
              HasSubstr("--resume latest needs --save-dir"));
  EXPECT_THAT(with([](TrainOptions& o) {
                o.saves.resume = "x";
                o.model.init_from = "y";
              }),
              HasSubstr("--resume and --init-from exclude each other"));
  EXPECT_THAT(with([](TrainOptions& o) {
                o.saves.save_dir = "x";
                o.saves.keep = -1;
              }),
              HasSubstr("--keep must be >= 0"));
}

TEST(SavePolicy, KeepsTheNewestAndRemovesInterruptedSaves) {
  TempDir tmp;
  TrainOptions o = test::tiny_options(6);
  o.saves.save_dir = tmp.file("run");
  o.saves.save_every = 2;
  o.saves.keep = 2;
  fs::create_directories(tmp.file("run/step-00000001"));  // an interrupted save, older than step 2
  Job(o).run();
  const std::vector<CheckpointEntry> left = list_checkpoints(o.saves.save_dir);
  ASSERT_EQ(left.size(), 2u);
  EXPECT_TRUE(left[0].step == 4 && left[0].committed);
  EXPECT_TRUE(left[1].step == 6 && left[1].committed);

  // Resuming the newest with nothing left to do saves nothing and modifies nothing.
  const uint64_t before = file_checksum(left[1].path + "/manifest.json");
  o.saves.resume = "latest";
  Job again(o);
  EXPECT_EQ(again.checkpoints->resumed_step(), 6);
  again.run();
  EXPECT_EQ(file_checksum(left[1].path + "/manifest.json"), before);
  EXPECT_EQ(list_checkpoints(o.saves.save_dir).size(), 2u);
}

TEST(SavePolicy, AnInterruptedSaveOfTheStepIsWrittenOverAndTidied) {
  TempDir tmp;
  TrainOptions o = test::tiny_options(2);
  o.saves.save_dir = tmp.file("run");
  const std::string step = tmp.file("run/step-00000002");
  fs::create_directories(step);
  // What a killed save leaves: its rank file, a writer's temporary, a rank file of a larger world.
  for (const char* name : {"rank-00000.safetensors", "rank-00000.safetensors.tmp.1.0", "rank-00007.safetensors"})
    std::ofstream(step + "/" + name) << std::string(100000, 'j');
  const int held = ::open((step + "/rank-00000.safetensors").c_str(), O_RDONLY);  // keeps its inode number
  ASSERT_GE(held, 0);
  struct stat old {}, now {};
  ASSERT_EQ(::fstat(held, &old), 0);
  Job(o).run();
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(step)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"manifest.json", "rank-00000.safetensors"}));
  ASSERT_EQ(::stat((step + "/rank-00000.safetensors").c_str(), &now), 0);
  EXPECT_EQ(now.st_ino, old.st_ino) << "the dead rank file is written over";
  ::close(held);
  const Manifest manifest = read_manifest(step);
  EXPECT_EQ(error_of([&] { verify_file(step, manifest.files.at(0), /*full=*/true); }), "(no error)");
}

TEST(SavePolicy, PruningALinkedCheckpointLeavesWhatItPointsTo) {
  TempDir tmp;
  TrainOptions o = test::tiny_options(2);
  o.saves.save_dir = tmp.file("archive");
  Job(o).run();
  const std::string archived = tmp.file("archive/step-00000002");
  std::map<std::string, uint64_t> before;
  for (const auto& e : fs::directory_iterator(archived)) before[e.path().string()] = file_checksum(e.path().string());
  fs::create_directories(tmp.file("run"));
  fs::create_directory_symlink(archived, tmp.file("run/step-00000002"));

  o.saves.save_dir = tmp.file("run");
  o.saves.resume = "latest";
  o.optimizer.steps = 6;
  o.saves.save_every = 2;
  o.saves.keep = 1;
  Job(o).run();  // step 4's prune drops the link, step 6's would have written into a spare
  std::map<std::string, uint64_t> after;
  for (const auto& e : fs::directory_iterator(archived)) after[e.path().string()] = file_checksum(e.path().string());
  EXPECT_EQ(after, before) << "the linked checkpoint is untouched";
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(o.saves.save_dir)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"step-00000006"});
}

TEST(SavePolicy, RejectsMismatchedModelAndOccupiedSaveDir) {
  TempDir tmp;
  TrainOptions o = test::tiny_options(2);
  o.saves.save_dir = tmp.file("run");
  Job(o).run();
  const std::string ckpt = o.saves.save_dir + "/" + step_dir_name(2);

  TrainOptions fresh = o;  // a new run into a directory that holds checkpoints
  EXPECT_THAT(setup_error(fresh),
              AllOf(HasSubstr("already holds checkpoints"), HasSubstr("--resume latest")));

  TrainOptions other = o;
  other.saves.save_dir.clear();
  other.saves.resume = ckpt;
  other.model.overrides["layers"] = 3;
  EXPECT_THAT(setup_error(other),
              AllOf(HasSubstr(ckpt + "/manifest.json: the checkpoint holds model tiny with ctx=128, dim=64, "
                              "heads=4, layers=2, vocab=256, the flags ask for tiny with ctx=128, dim=64, heads=4, "
                              "layers=3, vocab=256")));

  TrainOptions older = o;  // resuming an older checkpoint into the same directory would overwrite newer ones
  older.saves.save_dir = tmp.file("run2");
  older.saves.save_every = 1;
  Job(older).run();
  older.saves.resume = older.saves.save_dir + "/" + step_dir_name(1);
  EXPECT_THAT(setup_error(older), HasSubstr("which a save of this run would overwrite"));

  TrainOptions none = o;
  none.saves.save_dir = tmp.file("empty");
  none.saves.resume = "latest";
  EXPECT_THAT(setup_error(none), HasSubstr("--resume latest: no committed checkpoint"));
}

}  // namespace
}  // namespace zshard
