#include "shard/copy_on_update.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include <zshard/error.h>

#include "kernels/test_hooks.h"
#include "shard/checkpoint_commit.h"

namespace zshard {

CopyOnUpdate::CopyOnUpdate(ShardedParams& params) : params_(params), copies_(size_t(params.num_units())) {
  size_t slices = 0;
  for (int u = 0; u < params.num_units(); ++u) {
    const int64_t n = params.layout(u).shard_numel();
    numel_.push_back(n);
    for (const Tensor& state : owned_state(params, u)) {
      ZS_CHECK(state.device() == Device::cpu && state.dtype() == DType::f32, "CopyOnUpdate of state not on the host");
      live_.push_back(state.data<float>());
      first_slice_.push_back(slices);
      slices += size_t((n + kSaveSliceNumel - 1) / kSaveSliceNumel);
    }
  }
  first_slice_.push_back(slices);
  state_ = std::make_unique<std::atomic<uint8_t>[]>(slices);
  for (size_t s = 0; s < slices; ++s) state_[s].store(live, std::memory_order_relaxed);
  params_.set_update_guard(this);
}

CopyOnUpdate::~CopyOnUpdate() { params_.set_update_guard(nullptr); }

float* CopyOnUpdate::copy_of(size_t tensor) const {
  const size_t unit = tensor / kStateKinds;
  return static_cast<float*>(copies_[unit]->data()) + int64_t(tensor % kStateKinds) * numel_[unit];
}

const float* CopyOnUpdate::take(size_t tensor, int64_t begin, int64_t) {
  std::atomic<uint8_t>& state = state_[slice_of(tensor, begin)];
  uint8_t seen = live;
  if (state.compare_exchange_strong(seen, writing, std::memory_order_acq_rel)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(test_hooks().slow_slices_ms));  // the test hook's hold
    return live_[tensor] + begin;
  }
  while (seen == copying) {
    state.wait(copying, std::memory_order_acquire);
    seen = state.load(std::memory_order_acquire);
  }
  ZS_CHECK(seen == copied, "CopyOnUpdate: a slice taken twice");
  return copy_of(tensor) + begin;
}

void CopyOnUpdate::done(size_t tensor, int64_t begin) {
  std::atomic<uint8_t>& state = state_[slice_of(tensor, begin)];
  uint8_t seen = writing;
  if (state.compare_exchange_strong(seen, written, std::memory_order_release)) state.notify_all();
}

void CopyOnUpdate::writer_finished() {
  // A failed writer leaves slices live, or one claimed and never done: AdamW must not wait for them.
  for (size_t s = 0; s < first_slice_.back(); ++s) {
    uint8_t seen = state_[s].load(std::memory_order_acquire);
    if ((seen == live || seen == writing) && state_[s].compare_exchange_strong(seen, written)) state_[s].notify_all();
  }
}

void CopyOnUpdate::before_update(int unit) {
  const size_t first_tensor = size_t(unit) * kStateKinds;
  const size_t first = first_slice_[first_tensor], end = first_slice_[first_tensor + kStateKinds];
  // Made before any slice changes state, so that a failed allocation leaves the writer nothing to wait for.
  bool any_live = false;
  for (size_t s = first; s < end && !any_live; ++s) any_live = state_[s].load(std::memory_order_acquire) == live;
  if (any_live && !copies_[size_t(unit)])
    copies_[size_t(unit)] = std::make_unique<Buffer>(size_t(kStateKinds * numel_[size_t(unit)]) * sizeof(float),
                                                     Device::cpu, Category::host);
  // Every slice the writer has not reached is copied first, so that it is in the middle of one slice of
  // this unit at most: the only write the update then waits for. (Waiting slice by slice would let a
  // writer that is behind claim each next slice first, and the update would wait for all of them.)
  for (size_t tensor = first_tensor; tensor < first_tensor + kStateKinds; ++tensor)
    for (size_t s = first_slice_[tensor]; s < first_slice_[tensor + 1]; ++s) {
      uint8_t seen = live;
      if (!state_[s].compare_exchange_strong(seen, copying, std::memory_order_acq_rel)) continue;
      const int64_t begin = int64_t(s - first_slice_[tensor]) * kSaveSliceNumel;
      const int64_t count = std::min(kSaveSliceNumel, numel_[size_t(unit)] - begin);
      std::memcpy(copy_of(tensor) + begin, live_[tensor] + begin, size_t(count) * sizeof(float));
      state_[s].store(copied, std::memory_order_release);
      state_[s].notify_all();
    }
  for (size_t s = first; s < end; ++s)
    while (state_[s].load(std::memory_order_acquire) == writing) state_[s].wait(writing, std::memory_order_acquire);
}

int64_t CopyOnUpdate::copied_bytes() const {
  int64_t bytes = 0;
  for (const auto& copy : copies_) bytes += copy ? int64_t(copy->bytes()) : 0;
  return bytes;
}

}  // namespace zshard
