// Device work recorded once and replayed: a CUDA graph of what the host queued on the compute stream
// between begin() and end(). A replay runs the same kernels on the same addresses with the same
// arguments, so whatever changes between replays must live in memory the recorded work reads: the step's
// tokens and AdamW's factors, copied from page-locked host buffers the host rewrites (shard/step_graph.h).
//
// The legacy default stream cannot be captured, so a CapturedWork owns a blocking stream of its own and
// makes it this thread's compute stream (kernels/cuda/runtime.h) for its lifetime: eager work and
// recorded work then share one queue, and anything still issued on the legacy stream waits for it (and,
// from any thread, fails a recording, which end() reports). Made, used and destroyed on one thread.
#pragma once
#include <memory>
#include <string>

namespace zshard {

class CapturedWork {
 public:
  CapturedWork();  // fails on a build without the CUDA path
  ~CapturedWork();
  CapturedWork(const CapturedWork&) = delete;
  CapturedWork& operator=(const CapturedWork&) = delete;

  void begin();  // what the host queues from now on is recorded, not run
  // Stops recording and instantiates the graph; throws "CUDA graph capture failed: <why>" where CUDA refused
  // any of it. The recorded work has not run: replay() runs it.
  void end();
  void replay();  // queues the recorded work on the compute stream
  bool recorded() const;
  // Forgets the recording (its memory goes back to the driver once the device is done with it), and ends
  // one still open, unused.
  void drop();

 private:
  struct Handles;
  std::unique_ptr<Handles> h_;
};

}  // namespace zshard
