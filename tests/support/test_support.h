// Helpers shared by the test suites.
#pragma once
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <zshard/communicator.h>
#include <zshard/plan.h>

namespace zshard {
class GPT2;
}

namespace zshard::test {

// The world communicator of an MPI test binary (set up by tests/mpi/mpi_test_main.cpp).
comm::Communicator& world();
void set_world(comm::Communicator* world);
// The plan of `strategy` and `placement` on the whole MPI world, by arithmetic (no hosts, no device).
ShardPlan plan(const StrategyOptions& strategy, const Placement& placement = {});

// The tiny GPT-2, built once per test binary (its config: models/gpt2_config.h).
GPT2& tiny_gpt2();

// max_i |a_i - b_i| / max(max_i |b_i|, tiny): the error relative to the reference's scale.
double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b);
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b);

// The message of the zshard::Error that `f` throws, or "(no error)", so that a test can assert on what
// the user would read.
std::string error_of(const std::function<void()>& f);

// Sets the test hook `name` (kernels/test_hooks.h) to `value` for the length of a scope, and has zshard
// read the hooks again on the way in and out. An empty value leaves the hook off.
class ScopedHook {
 public:
  ScopedHook(const char* name, const std::string& value);
  ~ScopedHook();
  ScopedHook(const ScopedHook&) = delete;
  ScopedHook& operator=(const ScopedHook&) = delete;

 private:
  const char* name_;
};

// A fresh, empty directory under the system temp dir, removed at destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "zshard");
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Rank 0's temporary directory, seen by every rank of world() (they share the file system). Collective.
std::string shared_dir(const TempDir& mine);
// The bytes of the file at `path` (empty when it cannot be read).
std::string file_bytes(const std::filesystem::path& path);

}  // namespace zshard::test
