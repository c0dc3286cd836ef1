// Memory as zshard accounts it: every large buffer is allocated through a tracking allocator under a
// category, so that the memory report reads what was really allocated instead of estimating it.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <zshard/dtype.h>

namespace zshard {

// Model states are params + grads + optimizer (what the ZeRO formulas count), plus `host`: the optimizer
// state (fp32 master, Adam m and v) that --offload optimizer keeps in host memory, ZeRO-Offload's split.
// Transient full-size unit buffers that only exist around a collective (gathered params, unsharded grads
// before a reduce-scatter, staging) are `comm`.
// frozen: the compute copy of frozen parameters (ParamSpec::frozen), which have nothing else.
enum class Category : uint8_t { params, frozen, grads, optimizer, activations, comm, workspace, host };
constexpr int kNumCategories = 8;
constexpr std::array<Category, kNumCategories> kAllCategories = {
    Category::params, Category::frozen, Category::grads, Category::optimizer, Category::activations,
    Category::comm,   Category::workspace, Category::host};

std::string_view category_name(Category c);

// An owned allocation; frees itself through the allocator that made it.
class Buffer {
 public:
  Buffer(size_t bytes, Device device, Category category);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  Category category() const { return category_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  Category category_;
};

// Live and peak bytes per category of one device's allocator.
struct MemStats {
  std::array<int64_t, kNumCategories> live{};
  std::array<int64_t, kNumCategories> peak{};
  int64_t live_total = 0;
  int64_t peak_total = 0;  // peak of the sum, not the sum of peaks
  int64_t model_states_peak = 0;  // peak of params+grads+optimizer+host together
  int64_t model_states_live() const;
};

}  // namespace zshard
