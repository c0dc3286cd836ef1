// Copies between host memory and a device that run beside the compute stream, with numbered marks that
// order them against the host and the compute stream. The offloaded optimizer (shard/optimizer_offload.h)
// sends each unit's gradients to the host while backward still runs, and each unit's updated parameters
// back while the host steps the next unit.
//
// On the cpu device the host is the device: a copy is done at once (and is nothing where source and
// destination are the same memory) and every mark is reached as soon as it is set, so a cpu run makes the
// same calls in the same order as a GPU run, with nothing ever in flight. Tests give the cpu a stream whose
// copies run later, on a thread of their own or only when waited for (kernels/queued_copies.h), so that a
// missing wait shows there too.
#pragma once
#include <cstddef>
#include <memory>

#include <zshard/dtype.h>

namespace zshard {

class CopyStream {
 public:
  // Copies between host memory and `device`, with marks 0 .. marks-1.
  static std::unique_ptr<CopyStream> make(Device device, int marks);
  // A device's stream first waits, boundedly, for its queued copies; never throws.
  virtual ~CopyStream() = default;

  // The copies queued from now on start after the work queued on the compute stream so far.
  virtual void follow_compute() = 0;
  // Queues a copy of `bytes` from src to dst. Neither buffer may be touched before a mark set after the copy
  // is reached. Host memory should be page-locked (Category::host buffers are, on the CUDA path): from
  // pageable memory a device copies synchronously.
  virtual void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) = 0;
  // Mark i: reached once the copies queued so far are done.
  virtual void set_mark(int i) = 0;
  // The host blocks until mark i is reached (polling: the communicators' watchdogs keep running).
  virtual void host_waits(int i) = 0;
  // The compute stream waits for mark i; the host does not.
  virtual void compute_waits(int i) = 0;
};

}  // namespace zshard
