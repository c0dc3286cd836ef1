// The snapshot of an asynchronous save whose state lives in host memory (the cpu device, or an offloaded
// optimizer), taken only where it is needed. The writer thread writes the owned master, m and v where they
// live; AdamW, before it changes a unit, copies the slices the writer has not reached, and the writer
// takes those from the copy. A writer that keeps up with training costs no copy and no host memory; one
// that falls behind costs at most what a copy of everything at the step boundary would (the estimator's
// snapshot), taken a unit at a time by the optimizer step.
//
// Each slice (kSaveSliceNumel elements of one tensor: params, m or v of a unit) goes one of two ways:
//   live -> writing -> written    the writer got there first; AdamW waits for that one slice's write
//   live -> copying -> copied     AdamW got there first; the writer waits for that one slice's copy
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include <zshard/memory.h>

#include "kernels/io/safetensors.h"
#include "shard/sharded_params.h"

namespace zshard {

class CopyOnUpdate final : public SaveSliceSource, public UpdateGuard {
 public:
  // Becomes `params`' update guard until destroyed; every unit's owned state must be in host memory.
  explicit CopyOnUpdate(ShardedParams& params);
  ~CopyOnUpdate();
  CopyOnUpdate(const CopyOnUpdate&) = delete;
  CopyOnUpdate& operator=(const CopyOnUpdate&) = delete;

  // The writer thread: tensor 3u + k is unit u's params (k 0), m (1) or v (2), as in the rank file.
  const float* take(size_t tensor, int64_t begin, int64_t count) override;
  void done(size_t tensor, int64_t begin) override;
  // The writer thread, once it stops, written or failed: what it has not written is AdamW's to change.
  void writer_finished();

  // The training thread.
  void before_update(int unit) override;
  int64_t copied_bytes() const;  // host memory the copies hold

 private:
  enum State : uint8_t { live, writing, written, copying, copied };
  size_t slice_of(size_t tensor, int64_t begin) const { return first_slice_[tensor] + size_t(begin / kSaveSliceNumel); }
  float* copy_of(size_t tensor) const;

  ShardedParams& params_;
  std::vector<int64_t> numel_;        // per unit: shard_numel of each of its three tensors
  std::vector<float*> live_;          // per tensor
  std::vector<size_t> first_slice_;   // per tensor, and one past the last slice at the end
  std::unique_ptr<std::atomic<uint8_t>[]> state_;  // per slice
  // Per unit: params, m and v side by side; made by the training thread before it publishes a copied
  // slice of the unit, read by the writer only after it has seen one.
  std::vector<std::unique_ptr<Buffer>> copies_;
};

}  // namespace zshard
