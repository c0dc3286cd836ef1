// ZeRO-Offload for ShardedParams (--offload optimizer): the fp32 master shard and Adam m and v live in host
// memory and AdamW runs there, on the rank's share of the host's cores. Per unit, on one copy stream
// (kernels/copy_stream.h), each unit with a mark of its own:
//
//   gradients  on the micro-step that syncs, a unit's owned gradient shard goes to a host buffer as soon as
//              its reduction lands (ordered after the compute stream's work so far), so the copies overlap
//              the rest of backward; mark u follows the copy.
//   AdamW      unit by unit, in the order their gradients landed: the host waits for mark u, steps the unit
//              from the host gradients on all its threads, and queues the updated compute parameters to the
//              device: the fp32 master itself, or the bf16 copy that AdamW wrote over the host gradients
//              (read by then: one host buffer per unit serves both ways). So a unit's upload runs while the
//              host steps the next one.
//   the end    the compute stream, not the host, waits for the last upload (mark n), before the gather of
//              resident parameters and the next forward read them.
//
// A unit's next gradients are copied on the same stream as its last upload, so the host buffers are never
// written while a copy reads them. On the cpu device host and device memory are the same: with fp32
// parameters the host gradients are the owned gradients themselves, their copy is nothing, the upload of
// the master is a memcpy into the fp32 compute copy; with bf16 parameters the host gradients are a buffer
// of their own, as on a device. The cpu runs every call of the sequence above, so its tests cover the
// logic, with the same AdamW and the same bits as without offload; an asynchronous copy stream
// (kernels/copy_stream.h, ZSHARD_TEST_COPY_STREAM) runs the copies on a thread of their own.
//
// Host memory per owned parameter: the master, m and v (12 bytes, ShardedParams' own) and, on a device,
// the host gradients in the compute dtype (2 or 4 bytes): Category::host, page-locked on the CUDA path.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include <zshard/tensor.h>

#include "kernels/copy_stream.h"

namespace zshard {

// A piece of elementwise AdamW work over n elements: run(begin, count) steps [begin, begin + count).
struct AdamWPiece {
  size_t n;
  std::function<void(size_t begin, size_t count)> run;
};

class OptimizerOffload {
 public:
  // One unit's owned gradients and owned part of the compute copy (on the run's device), and its fp32
  // master shard (host memory).
  struct UnitBuffers {
    Tensor grads;
    Tensor compute;
    Tensor master;
  };
  OptimizerOffload(Device device, std::vector<UnitBuffers> units);

  // The unit's owned gradients in host memory: what AdamW reads and, with bf16 parameters, where it writes
  // the bf16 compute copy.
  const Tensor& host_grads(int unit) const { return units_[size_t(unit)].host_grads; }
  // The unit's owned gradients are final for this step: starts their copy to the host.
  void grads_landed(int unit);
  // AdamW of every unit (pieces(unit), run on this rank's share of the host's threads), each unit's
  // parameters sent back to the device behind it; returns once the last upload is queued.
  void step(const std::function<std::vector<AdamWPiece>(int unit)>& pieces);
  // Makes the unit's compute copy its master's (after the masters were written directly: loading). Waits
  // for the copy.
  void upload(int unit);
  // The step's gradients are dropped (a non-finite step, a load): waits for their copies to the host, which
  // an upload would race, and forgets them.
  void drop_gradients();

 private:
  struct Unit : UnitBuffers {
    Tensor host_grads;
    bool landed = false;
  };
  void queue_upload(const Unit& u);

  Device device_;
  std::vector<Unit> units_;
  std::vector<int> landed_order_;
  // Declared last, so destroyed first: its destructor waits for the copies from and into the buffers above.
  std::unique_ptr<CopyStream> copies_;
};

}  // namespace zshard
