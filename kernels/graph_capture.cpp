#include "kernels/graph_capture.h"

#include <zshard/error.h>

#ifdef ZSHARD_WITH_CUDA
#include "kernels/cuda/runtime.h"
#endif

namespace zshard {

#ifdef ZSHARD_WITH_CUDA

struct CapturedWork::Handles {
  cudaStream_t stream = nullptr;
  cudaStream_t previous = nullptr;  // the thread's compute stream before this one
  cudaGraphExec_t graph = nullptr;
  bool recording = false;
  // Called from the destructor too: never throws. A recording left open by an error is ended unused; a
  // replay still running reads the graph's memory.
  void drop() noexcept {
    if (recording) {
      cudaGraph_t abandoned = nullptr;
      cudaStreamEndCapture(stream, &abandoned);
      if (abandoned) cudaGraphDestroy(abandoned);
      cudaGetLastError();
      recording = false;
    }
    if (!graph) return;
    cuda::became_idle(stream, std::chrono::seconds(10));
    cudaGraphExecDestroy(graph);
    graph = nullptr;
    int device = 0;
    if (cudaGetDevice(&device) == cudaSuccess) cudaDeviceGraphMemTrim(device);
  }
};

CapturedWork::CapturedWork() : h_(std::make_unique<Handles>()) {
  ZS_CUDA_CHECK(cudaStreamCreate(&h_->stream));  // blocking: it waits for the legacy stream, outside captures
  h_->previous = cuda::compute_stream();
  cuda::set_compute_stream(h_->stream);
}

CapturedWork::~CapturedWork() {
  h_->drop();
  cuda::became_idle(h_->stream, std::chrono::seconds(10));
  cuda::set_compute_stream(h_->previous);
  cudaStreamDestroy(h_->stream);
}

void CapturedWork::begin() {
  ZS_CHECK(!h_->recording, "CapturedWork::begin: already recording");
  drop();
  // Thread-local: only this thread's calls that are unsafe while recording (cudaMalloc, a synchronous
  // copy) end it. Any thread's work on the legacy stream still would, as the recorded stream is a blocking
  // one; zshard's other threads (checkpoint writers) use streams of their own.
  ZS_CUDA_CHECK(cudaStreamBeginCapture(h_->stream, cudaStreamCaptureModeThreadLocal));
  h_->recording = true;
}

void CapturedWork::end() {
  ZS_CHECK(h_->recording, "CapturedWork::end: not recording");
  h_->recording = false;
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(h_->stream, &graph);
  if (ended != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    fail("CUDA graph capture failed: ", cudaGetErrorString(ended), " (", cudaGetErrorName(ended),
         "): some of the step's work cannot be recorded; run without CUDA graphs");
  }
  const cudaError_t made = cudaGraphInstantiateWithFlags(&h_->graph, graph, 0);
  cudaGraphDestroy(graph);
  if (made != cudaSuccess) {
    h_->graph = nullptr;
    cudaGetLastError();
    fail("CUDA graph capture failed: instantiating the graph: ", cudaGetErrorString(made), " (",
         cudaGetErrorName(made), "); run without CUDA graphs");
  }
}

void CapturedWork::replay() {
  ZS_CHECK(h_->graph, "CapturedWork::replay: nothing recorded");
  ZS_CUDA_CHECK(cudaGraphLaunch(h_->graph, h_->stream));
}

bool CapturedWork::recorded() const { return h_->graph != nullptr; }
void CapturedWork::drop() { h_->drop(); }

#else

struct CapturedWork::Handles {};

CapturedWork::CapturedWork() {
  fail("CUDA graphs: this zshard was built without the CUDA path (configure with -DZSHARD_CUDA=ON)");
}
CapturedWork::~CapturedWork() = default;
void CapturedWork::begin() {}
void CapturedWork::end() {}
void CapturedWork::replay() {}
bool CapturedWork::recorded() const { return false; }
void CapturedWork::drop() {}

#endif

}  // namespace zshard
