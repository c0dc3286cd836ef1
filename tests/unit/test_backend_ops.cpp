// Every op of ops:: on every backend from one table, in the spirit of ggml's test-backend-ops. A row names
// the ops it covers, the case whose backward is checked against central finite differences in double and
// whose float and bf16 runs are checked against the double and float ones on the CPU, and the CUDA test
// that compares the op with the CPU (tests/unit/test_cuda_*.cpp; skipped without a GPU). Ops that are not differentiable
// name the CPU test that checks them against a reference instead. An op declared in <zshard/ops.h> or
// kernels/engine_ops.h without a row fails EveryOpHasARow.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/unit/op_cases.h"

namespace zshard::cpu {
namespace {

// y (M, N) = A (M, K) @ B^T for B (N, K): the layout the transformer heads and Llama's projections use.
struct GemmCase {
  int M = 5, N = 7, K = 3;
  std::vector<size_t> input_sizes() const { return {size_t(M) * K, size_t(N) * K}; }
  template <class T>
  std::vector<T> forward(const Arrays<T>& in) const {
    std::vector<T> y(size_t(M) * N);
    gemm<T>(false, true, M, N, K, 1, in[0].data(), K, in[1].data(), K, 0, y.data(), N);
    return y;
  }
  template <class T>
  void backward(const Arrays<T>& in, const std::vector<T>& dy, Arrays<T>& g) const {
    gemm<T>(false, false, M, K, N, 1, dy.data(), N, in[1].data(), K, 1, g[0].data(), K);  // dA += dy @ B
    gemm<T>(true, false, N, K, M, 1, dy.data(), N, in[0].data(), K, 1, g[1].data(), K);   // dB += dy^T @ A
  }
};

struct Row {
  std::string name;
  std::vector<std::string> ops;      // the ops:: functions the row covers
  std::function<void()> cpu_checks;  // finite differences and float against double; null: see checked_by
  std::string checked_by;            // the CPU test of an op that is not differentiable
  std::string cuda_test;             // the CUDA comparison with the CPU
};

// The CPU's bf16 ops against its fp32 ones on the same bf16 inputs. Each output rounded once is within half
// a bf16 ulp (2^-9, 2e-3) of the fp32 value, measured against the output's largest element; attention
// rounds its scores, probabilities and score gradients too, a chain of a few such roundings, and sums
// over many rounded terms cancel little at these sizes: 1e-2. A wrong index or a lost accumulation is O(1).
constexpr double kBf16Tolerance = 1e-2;

template <class Case>
std::function<void()> checks(Case c) {
  return [c] {
    test::expect_backward_matches_finite_differences(c);
    test::expect_float_matches_double(c);
    test::expect_bf16_matches_float(c, kBf16Tolerance);
  };
}

// A frozen parameter's null gradient: the checks above on the other inputs, which also get the full op's bits.
template <class Case>
std::function<void()> frozen_checks(Case full, std::vector<size_t> frozen) {
  const FrozenCase<Case> c{full, std::move(frozen)};
  return [c] {
    checks(c)();
    expect_frozen_matches_full(c);
  };
}

const std::vector<Row>& table() {
  static const std::vector<Row> rows = {
      {"embedding", {"embedding_forward", "embedding_backward"}, checks(EmbeddingCase{}), "", "CudaOps.Embedding"},
      {"token embedding", {"embedding_forward", "embedding_backward"}, checks(TokenEmbeddingCase{}), "",
       "CudaOps.EmbeddingWithoutPositions"},
      {"embedding, frozen wte", {"embedding_backward"}, frozen_checks(EmbeddingCase{}, {0}), "",
       "CudaOps.EmbeddingFrozen"},
      {"embedding, frozen wpe", {"embedding_backward"}, frozen_checks(EmbeddingCase{}, {1}), "",
       "CudaOps.EmbeddingFrozen"},
      {"layernorm", {"layernorm_forward", "layernorm_backward"}, checks(LayerNormCase{}), "", "CudaOps.LayerNorm"},
      {"layernorm wide", {"layernorm_forward", "layernorm_backward"}, checks(LayerNormCase{3, 97}), "",
       "CudaOps.LayerNormManyRows"},
      {"layernorm, frozen gain", {"layernorm_backward"}, frozen_checks(LayerNormCase{}, {1}), "",
       "CudaOps.LayerNormFrozen"},
      {"layernorm, frozen bias", {"layernorm_backward"}, frozen_checks(LayerNormCase{}, {2}), "",
       "CudaOps.LayerNormFrozen"},
      {"layernorm, frozen gain and bias", {"layernorm_backward"}, frozen_checks(LayerNormCase{}, {1, 2}), "",
       "CudaOps.LayerNormFrozen"},
      {"rmsnorm", {"rmsnorm_forward", "rmsnorm_backward"}, checks(RmsNormCase{}), "", "CudaOps.RmsNorm"},
      {"rmsnorm, frozen gain", {"rmsnorm_backward"}, frozen_checks(RmsNormCase{}, {1}), "", "CudaOps.RmsNormFrozen"},
      {"rope", {"rope_forward", "rope_backward"}, checks(RopeCase{}), "", "CudaOps.Rope"},
      {"rope long", {"rope_forward", "rope_backward"}, checks(RopeCase{1, 67, 2, 10, {500000}}), "", "CudaOps.RopeLongSequence"},
      {"rope scaled", {"rope_forward", "rope_backward"}, checks(RopeCase{1, 67, 2, 16, {10000, {4, 1, 4, 64}}}), "",
       "CudaOps.RopeScaled"},
      {"gqa pack", {"gqa_pack", "gqa_pack_backward"}, checks(GqaPackCase{}), "", "CudaOps.GqaPack"},
      {"swiglu", {"swiglu_forward", "swiglu_backward"}, checks(SwigluCase{}), "", "CudaOps.SwiGlu"},
      {"swiglu, gradients set", {"swiglu_backward"}, checks(SwigluCase{37, InputGrad::set}), "", "CudaFused.SwiGluSet"},
      {"layernorm with the residual add", {"layernorm_residual_forward"}, checks(LayerNormResidualCase{}), "",
       "CudaFused.LayerNormResidual"},
      {"rmsnorm with the residual add", {"rmsnorm_residual_forward"}, checks(RmsNormResidualCase{}), "",
       "CudaFused.RmsNormResidual"},
      {"linear", {"linear_forward", "linear_backward"}, checks(LinearCase{true, 9, 13, 7}), "", "CudaOps.Linear"},
      {"linear no bias", {"linear_forward", "linear_backward"}, checks(LinearCase{false}), "", "CudaOps.Linear"},
      {"linear, frozen weight", {"linear_backward"}, frozen_checks(LinearCase{true, 9, 13, 7}, {1}), "",
       "CudaOps.LinearFrozen"},
      {"linear, frozen weight and bias", {"linear_backward"}, frozen_checks(LinearCase{}, {1, 2}), "",
       "CudaOps.LinearFrozen"},
      {"linear epilogue", {"linear_epilogue_forward", "linear_epilogue_backward"},
       checks(LinearEpilogueCase{{true, 9, 13, 7}}), "", "CudaFused.LinearEpilogue"},
      {"linear epilogue no bias", {"linear_epilogue_forward", "linear_epilogue_backward"},
       checks(LinearEpilogueCase{{false}}), "", "CudaFused.LinearEpilogue"},
      {"linear epilogue, frozen weight", {"linear_epilogue_backward"},
       frozen_checks(LinearEpilogueCase{{true, 9, 13, 7}}, {1}), "", "CudaFused.LinearEpilogueFrozen"},
      {"mlp through the gelu epilogue", {"linear_epilogue_forward", "linear_epilogue_backward"},
       checks(GeluMlpCase{}), "", "CudaFused.GeluMlp"},
      {"mlp through the gelu epilogue, frozen second weight", {"linear_epilogue_backward"},
       frozen_checks(GeluMlpCase{}, {3}), "", "CudaFused.GeluMlpFrozen"},
      {"mlp through the gelu epilogue, frozen first bias and weight", {"linear_epilogue_backward"},
       frozen_checks(GeluMlpCase{}, {1, 2}), "", "CudaFused.GeluMlpFrozen"},
      {"lora linear", {"lora_linear_forward", "lora_linear_backward"}, checks(LoraLinearCase{}), "",
       "CudaOps.LoraLinear"},
      {"lora linear, nn.Linear layout", {"lora_linear_forward", "lora_linear_backward"},
       checks(LoraLinearCase{WeightLayout::out_in, false, 9, 13, 7, 4}), "", "CudaOps.LoraLinearOutIn"},
      {"gemm", {"gemm"}, checks(GemmCase{}), "CpuGemm.MatchesTripleLoopForEveryTranspose", "CudaOps.GemmTransposed"},
      {"attention", {"attention_forward", "attention_backward"}, checks(AttentionCase{}), "", "CudaOps.Attention"},
      {"attention long", {"attention_forward", "attention_backward"}, checks(AttentionCase{1, 70, 8, 2}), "",
       "CudaOps.AttentionBackwardInPasses"},
      {"fused attention", {"fused_attention_forward", "fused_attention_backward"}, checks(FusedAttentionCase{}), "",
       "CudaFusedAttention.MatchesCpuGpt2Heads"},
      {"fused attention long", {"fused_attention_forward", "fused_attention_backward"},
       checks(FusedAttentionCase{1, 70, 8, 2}), "", "CudaFusedAttention.MatchesCpuAcrossRowBlocks"},
      {"gelu", {"gelu_forward", "gelu_backward"}, checks(GeluCase{37}), "", "CudaOps.Elementwise"},
      {"residual", {"residual_forward"}, checks(ResidualCase{}), "", "CudaOps.Elementwise"},
      {"cross entropy", {"cross_entropy_forward_backward"}, checks(CrossEntropyCase{}), "", "CudaOps.CrossEntropy"},
      {"adamw", {"adamw_step"}, nullptr, "CpuAdamW.MatchesTwoStepReference", "CudaOps.AdamW"},
      {"adamw over a shard's segments", {"set_step_settings", "adamw_step"}, nullptr,
       "OpsDispatch.AdamWStepsEachSegmentOrSkipsTheStep", "CudaOps.AdamWSegments"},
      {"sum of squares, axpy", {"sum_squares", "axpy"}, nullptr, "CpuReductions.SumSquaresAndAxpy",
       "CudaOps.SumSquares"},
      {"the step's scalars", {"sum_squares", "sum_in_order", "clip_grad_norm"}, nullptr,
       "OpsDispatch.StepScalarsStayInDeviceMemory", "CudaOps.StepSums"},
      {"read back", {"read_back"}, nullptr, "OpsDispatch.ReadBackIsACountedWait", "CudaOps.ReadBack"},
      {"convert", {"convert"}, nullptr, "OpsDispatch.ConvertsBetweenF32AndBf16OnCpu", "CudaModel.Bf16MatchesCpuFp32"},
      {"block quantization", {"quantize_blocks", "dequantize_blocks"}, nullptr,
       "CpuQuantize.EveryElementWithinHalfAScale", "CudaQuantize.MatchesCpuBitForBit"},
      {"synchronize", {"synchronize"}, nullptr, "OpsDispatch.CpuIsExactlyTheReference", "CudaModel.Fp32MatchesCpu"},
  };
  return rows;
}

// Every first capture of `pattern` in the source files `paths` (relative to the source tree).
std::set<std::string> find_in_sources(const std::vector<std::string>& paths, const std::string& pattern) {
  std::set<std::string> found;
  const std::regex re(pattern);
  for (const std::string& path : paths) {
    std::ifstream in(std::string(ZSHARD_SOURCE_DIR) + "/" + path);
    std::stringstream text;
    text << in.rdbuf();
    const std::string s = text.str();
    for (auto it = std::sregex_iterator(s.begin(), s.end(), re); it != std::sregex_iterator(); ++it)
      found.insert((*it)[1]);
  }
  return found;
}

TEST(BackendOps, EveryOpHasARow) {
  const std::set<std::string> declared = find_in_sources({"include/zshard/ops.h", "kernels/engine_ops.h"}, R"(\b(?:void|double)\s+(\w+)\(Device\b)");
  ASSERT_GE(declared.size(), 20u) << "the ops headers were not read";
  const std::set<std::string> cuda_tests = find_in_sources(
      {"tests/unit/test_cuda_ops.cpp", "tests/unit/test_cuda_fused.cpp", "tests/unit/test_cuda_model.cpp",
       "tests/unit/test_cuda_quantize.cpp", "tests/unit/test_cuda_attention.cpp", "tests/unit/test_cuda_step_ops.cpp"},
      R"(\bTEST\((Cuda\w+, \w+)\))");
  std::set<std::string> covered;
  for (const Row& row : table()) {
    EXPECT_TRUE(row.cpu_checks || !row.checked_by.empty()) << row.name << ": no CPU check";
    std::string cuda = row.cuda_test;
    if (const size_t dot = cuda.find('.'); dot != std::string::npos) cuda.replace(dot, 1, ", ");
    EXPECT_TRUE(cuda_tests.count(cuda)) << row.name << ": no CUDA test " << row.cuda_test;
    for (const std::string& op : row.ops) {
      EXPECT_TRUE(declared.count(op)) << row.name << ": ops::" << op << " is not in <zshard/ops.h> or kernels/engine_ops.h";
      covered.insert(op);
    }
  }
  for (const std::string& op : declared) EXPECT_TRUE(covered.count(op)) << "ops::" << op << " has no row in the table";
}

TEST(BackendOps, CpuBackwardMatchesFiniteDifferencesAndFloatMatchesDouble) {
  for (const Row& row : table()) {
    if (!row.cpu_checks) continue;
    SCOPED_TRACE(row.name);
    row.cpu_checks();
  }
}

}  // namespace
}  // namespace zshard::cpu
