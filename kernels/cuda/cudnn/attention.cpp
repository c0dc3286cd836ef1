// Fused causal attention through cuDNN's scaled dot-product attention, built as cudnn-frontend graphs
// (the headers scripts/install-deps.sh fetches; compiled only where they were found, cmake/Cuda.cmake).
// libcudnn is never linked: the frontend's shim calls it through a handle this file opens with dlopen
// (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING), so a binary starts on a machine without cuDNN and the runtime
// keeps the blocks path there (<zshard/ops.h>: fused_attention_unavailable).
//
// Layouts are the model's as they are, no copies: q, k and v are the strided slices of qkv (B, T, 3C),
// seen as (B, NH, T, hs) with strides (T*3C, hs, 3C, 1); the output and its gradient (B, T, C) as
// (B, NH, T, hs) with strides (T*C, hs, C, 1); the statistics (B, NH, T) fp32. The backward writes dq, dk
// and dv into the same slices of dqkv, with cuDNN's deterministic algorithm: the same bits every run.
// A graph is built once per shape and kept: building costs milliseconds, running microseconds.
#include <dlfcn.h>

#include <cudnn_frontend.h>

#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include <zshard/error.h>

#include "kernels/cuda/ops.cuh"
#include "kernels/cuda/runtime.h"

// The library handle the frontend's shim resolves every cuDNN call through.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace zshard::cuda {

namespace fe = cudnn_frontend;

namespace {

// cuDNN 9 is the first whose SDPA runs bf16 forward and backward with a deterministic backward on Hopper.
constexpr int64_t kMinCudnnVersion = 90000;

// dlopen's answer for libcudnn, once per process: "" when it loaded and is new enough, else why not.
const std::string& library_error() {
  static const std::string error = []() -> std::string {
    void* handle = nullptr;
    std::string tried;
    for (const char* name : {"libcudnn.so.9", "libcudnn.so"}) {
      if ((handle = dlopen(name, RTLD_NOW | RTLD_GLOBAL))) break;
      const char* why = dlerror();
      tried += std::string(tried.empty() ? "" : "; ") + (why ? why : name);
    }
    if (!handle) return "cuDNN not found at run time (" + tried + ")";
    fe::cudnn_dlhandle = handle;
    const int64_t version = fe::detail::get_backend_version();
    if (version < kMinCudnnVersion)
      return detail::concat("cuDNN ", version, " was loaded; fused attention needs ", kMinCudnnVersion, " or newer");
    return "";
  }();
  return error;
}

void check(const fe::error_t& status, const char* what) {
  if (status.is_bad()) fail("cuDNN SDPA ", what, ": ", status.err_msg);
}

// The process's cuDNN handle, made at the first op (it needs the device's context).
cudnnHandle_t handle() {
  static const cudnnHandle_t h = [] {
    ZS_CHECK(library_error().empty(), "fused attention: ", library_error());
    cudnnHandle_t made = nullptr;
    ZS_CHECK(fe::detail::create_handle(&made) == CUDNN_STATUS_SUCCESS, "fused attention: cudnnCreate failed");
    return made;
  }();
  return h;
}

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

struct Shape {
  int64_t B, NH, T, hs;
  auto key() const { return std::tuple(B, NH, T, hs); }
  // q, k, v and their gradients in qkv's rows of 3C; the output and its gradient in rows of C.
  std::vector<int64_t> dims() const { return {B, NH, T, hs}; }
  std::vector<int64_t> qkv_strides() const { return {T * 3 * NH * hs, hs, 3 * NH * hs, 1}; }
  std::vector<int64_t> out_strides() const { return {T * NH * hs, hs, NH * hs, 1}; }
};

using GraphPtr = std::shared_ptr<fe::graph::Graph>;

GraphPtr new_graph() {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return graph;
}

std::shared_ptr<fe::graph::Tensor_attributes> tensor(const GraphPtr& graph, const char* name, Uid uid,
                                                     const std::vector<int64_t>& dims,
                                                     const std::vector<int64_t>& strides) {
  return graph->tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims).set_stride(strides));
}

std::vector<int64_t> stats_dims(const Shape& s) { return {s.B, s.NH, s.T, 1}; }
std::vector<int64_t> stats_strides(const Shape& s) { return {s.NH * s.T, s.T, 1, 1}; }

void build(const GraphPtr& graph) {
  const cudnnHandle_t h = handle();
  check(graph->validate(), "graph validation");
  check(graph->build_operation_graph(h), "operation graph");
  check(graph->create_execution_plans({fe::HeurMode_t::A}), "execution plans");
  check(graph->check_support(h), "support (bf16, head size a multiple of 8 up to 256)");
  check(graph->build_plans(h), "plans");
}

GraphPtr forward_graph(const Shape& s) {
  GraphPtr graph = new_graph();
  const auto q = tensor(graph, "Q", kQ, s.dims(), s.qkv_strides());
  const auto k = tensor(graph, "K", kK, s.dims(), s.qkv_strides());
  const auto v = tensor(graph, "V", kV, s.dims(), s.qkv_strides());
  const auto options = fe::graph::SDPA_attributes()
                           .set_name("causal_attention")
                           .set_generate_stats(true)
                           .set_causal_mask(true)
                           .set_attn_scale(1.f / std::sqrt(float(s.hs)));
  auto [o, stats] = graph->sdpa(q, k, v, options);
  o->set_output(true).set_uid(kO).set_dim(s.dims()).set_stride(s.out_strides());
  stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim(stats_dims(s))
      .set_stride(stats_strides(s));
  build(graph);
  return graph;
}

GraphPtr backward_graph(const Shape& s) {
  GraphPtr graph = new_graph();
  const auto q = tensor(graph, "Q", kQ, s.dims(), s.qkv_strides());
  const auto k = tensor(graph, "K", kK, s.dims(), s.qkv_strides());
  const auto v = tensor(graph, "V", kV, s.dims(), s.qkv_strides());
  const auto o = tensor(graph, "O", kO, s.dims(), s.out_strides());
  const auto d_o = tensor(graph, "dO", kDO, s.dims(), s.out_strides());
  const auto stats = graph->tensor(fe::graph::Tensor_attributes()
                                       .set_name("Stats")
                                       .set_uid(kStats)
                                       .set_dim(stats_dims(s))
                                       .set_stride(stats_strides(s))
                                       .set_data_type(fe::DataType_t::FLOAT));
  const auto options = fe::graph::SDPA_backward_attributes()
                           .set_name("causal_attention_backward")
                           .set_deterministic_algorithm(true)
                           .set_causal_mask(true)
                           .set_attn_scale(1.f / std::sqrt(float(s.hs)));
  auto [dq, dk, dv] = graph->sdpa_backward(q, k, v, o, d_o, stats, options);
  dq->set_output(true).set_uid(kDQ).set_dim(s.dims()).set_stride(s.qkv_strides());
  dk->set_output(true).set_uid(kDK).set_dim(s.dims()).set_stride(s.qkv_strides());
  dv->set_output(true).set_uid(kDV).set_dim(s.dims()).set_stride(s.qkv_strides());
  build(graph);
  return graph;
}

// The built graph of `s` for one direction, built at its first use.
const fe::graph::Graph& cached(const Shape& s, bool backward) {
  static std::mutex mutex;
  static std::map<std::tuple<bool, int64_t, int64_t, int64_t, int64_t>, GraphPtr> graphs;
  const std::lock_guard<std::mutex> lock(mutex);
  GraphPtr& graph = graphs[std::tuple_cat(std::tuple(backward), s.key())];
  if (!graph) graph = backward ? backward_graph(s) : forward_graph(s);
  return *graph;
}

void run(const fe::graph::Graph& graph, std::unordered_map<int64_t, void*>& pointers, cudaStream_t stream) {
  const cudnnHandle_t h = handle();
  ZS_CHECK(fe::detail::set_stream(h, stream) == CUDNN_STATUS_SUCCESS, "fused attention: cudnnSetStream failed");
  Buffer scratch = workspace(size_t(graph.get_workspace_size()), stream);
  check(graph.execute(h, pointers, scratch.data()), "execution");
}

Shape shape_of(int B, int Tn, int C, int NH) {
  ZS_CHECK(NH > 0 && C % NH == 0, "fused attention: C=", C, " is not a multiple of NH=", NH);
  return {B, NH, Tn, C / NH};
}

// Pointers the frontend takes as void*; cuDNN only reads the inputs.
void* in(const void* p) { return const_cast<void*>(p); }

}  // namespace

std::string cudnn_unavailable() { return library_error(); }

void fused_attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int Tn, int C, int NH,
                             cudaStream_t stream) {
  const Shape s = shape_of(B, Tn, C, NH);
  if (B == 0 || Tn == 0) return;
  std::unordered_map<int64_t, void*> pointers = {
      {kQ, in(qkv)}, {kK, in(qkv + C)}, {kV, in(qkv + 2 * C)}, {kO, out}, {kStats, lse}};
  run(cached(s, false), pointers, stream);
}

void fused_attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out, const float* lse,
                              int B, int Tn, int C, int NH, cudaStream_t stream) {
  const Shape s = shape_of(B, Tn, C, NH);
  if (B == 0 || Tn == 0) return;
  std::unordered_map<int64_t, void*> pointers = {
      {kQ, in(qkv)},   {kK, in(qkv + C)},   {kV, in(qkv + 2 * C)},   {kO, in(out)},       {kDO, in(dout)},
      {kStats, in(lse)}, {kDQ, dqkv},       {kDK, dqkv + C},         {kDV, dqkv + 2 * C}};
  run(cached(s, true), pointers, stream);
}

}  // namespace zshard::cuda
