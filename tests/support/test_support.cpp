#include "tests/support/test_support.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>

#include <zshard/error.h>

#include "kernels/test_hooks.h"
#include "models/gpt2.h"

namespace zshard::test {

GPT2& tiny_gpt2() {
  static GPT2 model(gpt2_config("tiny"));
  return model;
}

namespace {
comm::Communicator* g_world = nullptr;

template <class T>
double rel_diff(const std::vector<T>& a, const std::vector<T>& b) {
  ZS_CHECK(a.size() == b.size(), "comparing vectors of ", a.size(), " and ", b.size(), " elements");
  double scale = 0, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::abs(double(b[i])));
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
  }
  return diff / std::max(scale, 1e-30);
}
}  // namespace

ShardPlan plan(const StrategyOptions& strategy, const Placement& placement) {
  return plan_for_world({strategy, placement}, world().size());
}

comm::Communicator& world() {
  ZS_CHECK(g_world, "world() used outside an MPI test binary");
  return *g_world;
}
void set_world(comm::Communicator* w) { g_world = w; }

double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) { return rel_diff(a, b); }
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) { return rel_diff(a, b); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

ScopedHook::ScopedHook(const char* name, const std::string& value) : name_(name) {
  if (!value.empty()) ::setenv(name, value.c_str(), 1);
  reload_test_hooks();
}

ScopedHook::~ScopedHook() {
  ::unsetenv(name_);
  reload_test_hooks();
}

std::string shared_dir(const TempDir& mine) {
  std::vector<int32_t> chars(4096, 0);
  const std::string path = mine.path().string();
  std::copy(path.begin(), path.end(), chars.begin());
  world().broadcast(chars.data(), chars.size(), DType::i32, 0)->wait();
  return std::string(chars.begin(), std::find(chars.begin(), chars.end(), 0));
}

TempDir::TempDir(const std::string& tag) {
  static std::atomic<int> counter{0};
  std::random_device rd;
  path_ = std::filesystem::temp_directory_path() /
          (tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
           std::to_string(rd()));
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace zshard::test
