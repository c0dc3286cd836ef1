// The ZeRO paper's model-state arithmetic (Rajbhandari et al. 2020, table 1) as zshard-mem computes it,
// and the estimator's extra terms for GPT-2 and Llama configs.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <zshard/testing.h>

#include <zshard/error.h>
#include <zshard/model_registry.h>

#include "kernels/allocator.h"
#include "kernels/cpu/ops.h"
#include "models/gpt2.h"
#include "models/llama.h"
#include "runtime/cli/memory_flags.h"
#include "shard/memory/estimator.h"
#include "shard/flat_unit.h"
#include "shard/reduction_quantization.h"
#include "tests/support/model_checks.h"

namespace zshard {
namespace {

constexpr int64_t kPsi = 7'500'000'000;

// The plan of `kind` on `world` ranks (hybrid in groups of `group`; 0: the default), fp32 on the cpu.
ShardPlan plan(StrategyKind kind, int world, int group = 0) {
  PlanOptions o;
  o.strategy.kind = kind;
  if (group > 0) o.strategy.shard_group = ShardGroupRequest::equal(group);
  return plan_for_world(o, world);
}

double model_state_gb(StrategyKind kind, int world) {
  EstimateInput in;
  in.params = kPsi;
  in.plan = plan(kind, world);
  in.plan.placement.param_dtype = DType::bf16;
  return double(estimate_memory(in).model_states.total()) / 1e9;
}

// 7.5e9 parameters, mixed-precision Adam (K=12): ddp 16Ψ, zero1 4Ψ+12Ψ/N, zero2 2Ψ+14Ψ/N, zero3 16Ψ/N.
TEST(MemoryEstimator, ZeroPaperTableFor7_5B) {
  struct Row {
    int world;
    double ddp, zero1, zero2, zero3;  // GB
  };
  const Row rows[] = {
      {1, 120, 120, 120, 120},
      {4, 120, 52.5, 41.25, 30},
      {16, 120, 35.625, 21.5625, 7.5},
      {64, 120, 31.40625, 16.640625, 1.875},
      {1024, 120, 30.087890625, 15.1025390625, 0.1171875},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE("N=" + std::to_string(r.world));
    // Shards round up to whole elements, so allow a few bytes per rank.
    EXPECT_NEAR(model_state_gb(StrategyKind::ddp, r.world), r.ddp, 1e-6);
    EXPECT_NEAR(model_state_gb(StrategyKind::zero1, r.world), r.zero1, 1e-6);
    EXPECT_NEAR(model_state_gb(StrategyKind::zero2, r.world), r.zero2, 1e-6);
    EXPECT_NEAR(model_state_gb(StrategyKind::zero3, r.world), r.zero3, 1e-6);
  }
  // The paper's rounded figures at N=64: 120, 31.4, 16.6, 1.88 GB.
  EXPECT_NEAR(model_state_gb(StrategyKind::zero1, 64), 31.4, 0.05);
  EXPECT_NEAR(model_state_gb(StrategyKind::zero2, 64), 16.6, 0.05);
  EXPECT_NEAR(model_state_gb(StrategyKind::zero3, 64), 1.88, 0.01);
}

// zshard's CPU path: 4-byte params and grads, K=8 (Adam m and v): still 16 bytes per parameter.
TEST(MemoryEstimator, Fp32PolicyIsSixteenBytesWithKEight) {
  EstimateInput in;
  in.params = 1'000'000;
  in.plan = plan(StrategyKind::ddp, 4);
  const ModelStateBytes ddp = estimate_memory(in).model_states;
  EXPECT_EQ(ddp.params, 4'000'000);
  EXPECT_EQ(ddp.grads, 4'000'000);
  EXPECT_EQ(ddp.optimizer, 8'000'000);
  in.plan = plan(StrategyKind::zero2, 4);
  const ModelStateBytes z2 = estimate_memory(in).model_states;
  EXPECT_EQ(z2.total(), 4'000'000 + 12'000'000 / 4);
}

TEST(MemoryEstimator, HybridShardsInsideItsGroup) {
  EstimateInput in;
  in.params = 8'000'000;
  in.plan = plan(StrategyKind::hybrid, 16, 4);
  in.plan.placement.param_dtype = DType::bf16;
  const MemoryEstimate e = estimate_memory(in);
  EXPECT_EQ(e.shard_group, 4);
  EXPECT_EQ(e.model_states.total(), 16 * 8'000'000 / 4);
  EXPECT_THROW(plan(StrategyKind::hybrid, 16, 3), UsageError);
}

// zero3 on 4 ranks, `rank_batch` sequences of `seq` per rank.
EstimateInput zero3_on_4(const Model& model, int rank_batch = 2, int seq = 128) {
  EstimateInput in;
  in.model = &model;
  in.plan = plan(StrategyKind::zero3, 4);
  in.rank_batch = rank_batch;
  in.seq = seq;
  return in;
}

// GPT-2 cut to 2 layers (53.6M parameters, the embedding most of them), as the measurements below ran it.
GPT2Config two_layer_gpt2() {
  GPT2Config config = gpt2_config("gpt2");
  config.layers = 2;
  return config;
}

// A tied model whose embedding (`embed` elements) dominates, on 4 ranks at 2 sequences of 128: two units in
// flight under zero3 (the embedding and a `block`). With fewer tokens than channels the head's weight
// gradient waits for the embedding's backward, whose gradient opens alone (zero2) and within what zero3's
// two gathered units already take. At `large_batch` sequences the head adds it at once: open through
// backward beside two blocks' (zero2), and beside the gathered units at the head (zero3). The activations
// are the model's own.
void expect_tied_head_terms(const Model& model, int64_t embed, int64_t block, int large_batch) {
  EstimateInput in = zero3_on_4(model);
  ASSERT_FALSE(model.keeps_gradients_open(2, 128));
  MemoryEstimate e = estimate_memory(in);
  EXPECT_EQ(e.gathered_in_flight, (embed + block) * 4);
  EXPECT_EQ(e.comm_buffers, 0);
  EXPECT_EQ(e.activations, model.activation_bytes(2, 128, DType::f32));
  in.plan = plan(StrategyKind::zero2, 4);
  EXPECT_EQ(estimate_memory(in).comm_buffers, embed * 4);

  in.rank_batch = large_batch;
  ASSERT_TRUE(model.keeps_gradients_open(large_batch, 128));
  EXPECT_EQ(estimate_memory(in).comm_buffers, (embed + 2 * block) * 4);
  in.plan = plan(StrategyKind::zero3, 4);
  e = estimate_memory(in);
  EXPECT_EQ(e.comm_buffers, embed * 4);
  EXPECT_EQ(e.activations, model.activation_bytes(large_batch, 128, DType::f32));
}

TEST(MemoryEstimator, Gpt2ConfigCountsEveryTerm) {
  const GPT2Config config = gpt2_config("gpt2");
  const GPT2 model(config);
  EstimateInput in = zero3_on_4(model);
  const MemoryEstimate e = estimate_memory(in);
  EXPECT_EQ(e.params, config.num_params());
  // Per-unit padding adds at most group-1 elements per unit.
  const int64_t units = config.layers + 2;
  EXPECT_GE(e.model_states.total(), 16 * e.params / 4);
  EXPECT_LE(e.model_states.total(), 16 * (e.params + units * 3) / 4 + 16);
  // The embedding is wte + wpe.
  const int64_t C = config.dim;
  expect_tied_head_terms(model, int64_t(config.vocab + config.ctx) * C, 12 * C * C + 13 * C, 8);

  in.plan = plan(StrategyKind::ddp, 4);
  const MemoryEstimate ddp = estimate_memory(in);
  EXPECT_EQ(ddp.gathered_in_flight, 0);
  // The all-reduce ring's scratch on the cpu: a quarter of the largest unit, the embedding, in fp32.
  EXPECT_EQ(ddp.comm_buffers, (int64_t(config.vocab + config.ctx) * C + 3) / 4 * 4);
  EXPECT_EQ(ddp.model_states.total(), 16 * ddp.params);
}

// On the cpu in bf16 each op computes on fp32 copies of its arrays, a block at a time: a model's
// workspace_bytes is the most one op of its step holds at once, which the estimate counts (op_scratch).
// Measured over a forward_backward of each configuration (after one that makes the activations), it is
// the measure to the byte, whichever op copies most: the MLP's activation (GELU, SwiGLU, wide or not),
// attention's fused or blocks backward (16 heads of 4 channels), a fused linear layer, an adapted layer's
// GEMMs beside its scratch, or the head's GEMMs and cross-entropy where the logits fill a block.
TEST(MemoryEstimator, WorkspaceBytesIsTheMeasuredPeakOfTheCpuBf16Ops) {
  struct Case {
    const char* what;
    std::function<std::unique_ptr<Model>()> make;
    AttentionKernel attention;
    FusedEpilogues fused;
    int B, T;
  };
  const auto gpt2 = [](int layers, int dim, int heads, int vocab, LoraSettings lora = {}) {
    return [=] { return std::unique_ptr<Model>(new GPT2({layers, dim, heads, vocab, 128, lora})); };
  };
  const auto llama = [](int ffn_dim, LoraSettings lora = {}) {
    return [=] {
      LlamaConfig c = llama_config("llama-tiny");
      c.ffn_dim = ffn_dim;
      c.lora = lora;
      return std::unique_ptr<Model>(new Llama(c));
    };
  };
  const LoraSettings all_gpt2{4, 8, "c_attn,c_proj,c_fc"};
  const LoraSettings all_llama{4, 8, "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"};
  const auto fused = AttentionKernel::fused, blocks = AttentionKernel::blocks;
  const auto separate = FusedEpilogues::automatic, on = FusedEpilogues::on;  // automatic: separate in bf16 on the cpu
  const std::vector<Case> cases = {
      {"gpt2 tiny", gpt2(2, 64, 4, 256), fused, separate, 4, 64},
      {"gpt2 tiny, fused linear layers", gpt2(2, 64, 4, 256), fused, on, 4, 64},
      {"gpt2 16 heads, blocks attention", gpt2(1, 64, 16, 256), blocks, on, 2, 128},
      {"gpt2 16 heads, blocks attention, odd T", gpt2(1, 64, 16, 256), blocks, on, 2, 127},
      {"gpt2 tiny, its head's weight gradient deferred", gpt2(2, 64, 4, 256), fused, separate, 1, 32},
      {"gpt2 tiny, LoRA everywhere", gpt2(2, 64, 4, 256, all_gpt2), fused, on, 4, 64},
      {"gpt2 vocabulary", gpt2(1, 64, 4, 50257), fused, separate, 8, 64},
      {"llama-tiny", llama(192), fused, separate, 4, 64},
      {"llama-tiny, ffn 768, LoRA everywhere", llama(768, all_llama), blocks, separate, 4, 64},
  };
  Allocator& cpu = Allocator::of(Device::cpu);
  const int workspace = int(Category::workspace);
  for (const Case& c : cases)
    for (DType dtype : {DType::bf16, DType::f32}) {  // in f32 an adapter's input-gradient scratch alone
      SCOPED_TRACE(testing::Message() << c.what << " in " << dtype_name(dtype));
      const std::unique_ptr<Model> model = c.make();
      model->set_attention(c.attention);
      model->set_fused_epilogues(c.fused);
      LocalParams ctx(*model, dtype);
      test::randomize_params(ctx, 0.05, 41);
      const test::RandomTokens data(c.B, c.T, model->vocab_size(), 42);
      model->forward_backward(ctx, data.batch(), 1.0f);
      const int64_t before = cpu.stats().live[workspace];
      cpu.reset_peaks();
      model->forward_backward(ctx, data.batch(), 1.0f);
      EXPECT_EQ(cpu.stats().peak[workspace] - before, model->workspace_bytes(c.B, c.T, dtype, Device::cpu).most());
    }
}

// Where each op's copies fall: a tied head's weight gradient at the head, before any reduction, or deferred
// to the embedding's backward (fewer tokens than channels), the unit made ready last.
TEST(MemoryEstimator, WorkspaceBytesPlaceTheHeadsWeightGradient) {
  GPT2 model(two_layer_gpt2());
  model.set_attention(AttentionKernel::fused);
  const int C = 768, V = model.vocab_size();
  const WorkspaceBytes at_head = model.workspace_bytes(1, 1024, DType::bf16, Device::cpu);
  EXPECT_EQ(at_head.last_unit, 0);
  EXPECT_GE(at_head.before_reductions, cpu::bf16_gemm_scratch_bytes(V, C, 1024));
  EXPECT_LT(at_head.during_reductions, cpu::bf16_gemm_scratch_bytes(V, C, 1024));  // the blocks' alone
  const WorkspaceBytes deferred = model.workspace_bytes(1, 512, DType::bf16, Device::cpu);
  EXPECT_EQ(deferred.last_unit, cpu::bf16_gemm_scratch_bytes(V, C, 512));
  EXPECT_EQ(deferred.most(), std::max(deferred.before_reductions, deferred.last_unit));
}

// The estimate counts the model's workspace_bytes, here the gpt2 head's bound of a block where its logits
// fill one: zshard-train measured the 2-layer GPT-2 at 8x256 in bf16 on one rank at a peak of 1185.9 MiB
// (fused attention, its default there). The cpu in fp32 copies nothing; a GPU (fused attention) holds the
// scratch every cuBLAS call is given, 32 MiB, beside what an op keeps.
TEST(MemoryEstimator, EstimateCountsTheModelsWorkspace) {
  GPT2 model(two_layer_gpt2());
  model.set_attention(AttentionKernel::fused);
  EstimateInput in = zero3_on_4(model, 8, 256);
  in.plan = plan(StrategyKind::ddp, 1);
  EXPECT_EQ(estimate_memory(in).op_scratch, 0);
  in.plan.placement.param_dtype = DType::bf16;
  const MemoryEstimate e = estimate_memory(in);
  EXPECT_EQ(e.op_scratch, model.workspace_bytes(8, 256, DType::bf16, Device::cpu).most());
  EXPECT_LE(e.op_scratch, int64_t(cpu::kOpScratchBytes) + 8 * 256 * 4);
  EXPECT_EQ(e.total(), e.model_states.total() + e.activations + e.op_scratch);
  EXPECT_NEAR(double(e.total()) / (1185.9 * (1 << 20)), 1.0, 0.001);
  in.plan.placement.device = Device::cuda;
  constexpr int64_t kCublasScratch = int64_t(32) << 20;
  EXPECT_EQ(estimate_memory(in).op_scratch, kCublasScratch);
  model.set_attention(AttentionKernel::blocks);  // its score gradients: 8 sequences' 12 heads
  EXPECT_EQ(estimate_memory(in).op_scratch, int64_t(8) * 12 * 256 * 256 * 2 + kCublasScratch);
}

// bf16 gradients reduced in fp32 (zshard-train's default beside bf16 parameters) are first converted whole
// into an fp32 buffer of their unit, then reduced into an fp32 scratch shard. zshard-train measured these
// comm peaks for gpt2 at 2 layers, np 2, 2x16 per rank: two units' copies under ddp on the cpu beside the
// largest one's all-reduce chunk (its ring's scratch, half of it), two units' copies and scratch shards
// under zero1. Reduced in bf16 there is no conversion.
TEST(MemoryEstimator, Bf16GradientsReducedInFp32AreConvertedIntoBuffersOfTheirUnits) {
  GPT2 model(two_layer_gpt2());
  EstimateInput in = zero3_on_4(model, 2, 16);
  for (const auto& [kind, measured] : {std::pair{StrategyKind::ddp, 264'654'336}, {StrategyKind::zero1, 278'830'080}}) {
    SCOPED_TRACE(strategy_name(kind));
    in.plan = plan(kind, 2);
    in.plan.placement.param_dtype = DType::bf16;
    EXPECT_EQ(estimate_memory(in).comm_buffers, measured);
    in.plan.placement.reduce_dtype = DType::bf16;
    EXPECT_LT(estimate_memory(in).comm_buffers, measured / 4) << "no fp32 copies";
  }
}

// A unit is initialised whole in fp32: in its own buffers where they hold it so (ddp in fp32 on the cpu),
// else in a staging beside the states made so far, which can be the run's peak. gpt2 at 1 layer with LoRA
// rank 4, np 2, 1x16 per rank: zshard-train measured 190,959,000 bytes under ddp in fp32 (a step's peak),
// and 236,302,874 under zero2 in bf16 (the frozen embedding's fp32 staging beside its bf16 copy), whose
// step zshard-bench measured at 137,307,100 (the head's GEMM copying its weight in tiles).
TEST(MemoryEstimator, SetUpStagesAUnitInFp32WhereItsBuffersDoNotHoldIt) {
  const std::unique_ptr<Model> model = build_model("gpt2", model_config("gpt2", {{"layers", 1}, {"lora_rank", 4}}));
  EstimateInput in = zero3_on_4(*model, 1, 16);
  in.plan = plan(StrategyKind::ddp, 2);
  MemoryEstimate e = estimate_memory(in);
  EXPECT_LT(e.set_up, e.step_total()) << "written in place";
  EXPECT_NEAR(double(e.total()) / 190'959'000, 1.0, 1e-4);  // the attention kernel aside
  in.plan = plan(StrategyKind::zero2, 2);
  in.plan.placement.param_dtype = DType::bf16;
  e = estimate_memory(in);
  EXPECT_GT(e.set_up, e.step_total());
  EXPECT_EQ(e.total(), 236'302'874);
  EXPECT_NEAR(double(e.step_total()) / 137'307'100, 1.0, 0.002);
}

// An import (--init-from) reads each unit's buffers whole in fp32 after every state exists: gpt2 at 2 layers
// with LoRA rank 8 on one rank, 1x16, fp32: zshard-train --init-from measured 372,566,160 bytes, the
// states beside the frozen embeddings (wte and wpe, one buffer) read in; without the import 0.592 of it.
TEST(MemoryEstimator, AnImportReadsTheLargestBufferBesideEveryState) {
  const std::unique_ptr<Model> model = build_model("gpt2", model_config("gpt2", {{"layers", 2}, {"lora_rank", 8}}));
  EstimateInput in = zero3_on_4(*model, 1, 16);
  in.plan = plan(StrategyKind::ddp, 1);
  const int64_t without = estimate_memory(in).total();
  in.imports_weights = true;
  const MemoryEstimate e = estimate_memory(in);
  EXPECT_EQ(e.total(), e.set_up);
  EXPECT_NEAR(double(e.total()) / 372'566'160, 1.0, 1e-4);
  EXPECT_LT(double(without) / 372'566'160, 0.7);
}

// --reshard-after-forward false keeps every unit gathered from its forward to its backward. GPT-2 with 2
// layers at 1x64 per rank (the head's weight gradient deferred) peaks at the embedding's backward: its
// gathered copy beside its full gradient, the blocks released by then. zshard-bench measured exactly
// these comm bytes at np 4 (315,070,464 under zero3; 185,886,720, the embedding and a prefetched block,
// when resharding).
TEST(MemoryEstimator, KeptGatheredUnitsPeakAtTheEmbeddingsBackward) {
  const GPT2Config config = two_layer_gpt2();
  const GPT2 model(config);
  EstimateInput in = zero3_on_4(model, 1, 64);
  const int64_t embed = int64_t(config.vocab + config.ctx) * config.dim * 4;
  MemoryEstimate e = estimate_memory(in);
  EXPECT_EQ(e.gathered_in_flight + e.comm_buffers, 185'886'720);
  in.plan.reshard_after_forward = false;
  e = estimate_memory(in);
  int64_t padded = 0;
  for (const UnitSpec& u : model.units()) padded += FlatLayout(u, 4).padded_numel();
  EXPECT_EQ(e.gathered_in_flight, padded * 4);  // every unit
  EXPECT_EQ(e.gathered_in_flight + e.comm_buffers, 2 * embed);
  EXPECT_EQ(2 * embed, 315'070'464);
  in.plan.kind = StrategyKind::zero2;  // nothing to gather: the flag changes nothing
  const int64_t kept = estimate_memory(in).total();
  in.plan.reshard_after_forward = true;
  EXPECT_EQ(estimate_memory(in).total(), kept);
}

// zero3's backward holds a unit under its gather with the next prefetched, beside its gradient and the
// one still in flight. llama-tiny (untied) at 4x64 per rank peaks at the second layer's backward: both
// layers gathered, its gradient and the final unit's (norm and head) in flight. zshard-bench measured
// these comm bytes at np 4 from the second step on (657,152; 591,360 with --max-inflight 1); the estimate
// counted one gathered unit in backward (591,360) and fell short of the measured peak by 1.2%.
TEST(MemoryEstimator, BackwardPrefetchesBesideTheGradientsInFlight) {
  const std::unique_ptr<Model> model = build_model("llama-tiny", model_config("llama-tiny"));
  EstimateInput in = zero3_on_4(*model, 4, 64);
  std::vector<int64_t> units;
  for (const UnitSpec& u : model->units()) units.push_back(FlatLayout(u, 4).padded_numel());
  ASSERT_EQ(units.size(), 4u);  // embedding, two layers, final
  const MemoryEstimate e = estimate_memory(in);
  EXPECT_EQ(e.gathered_in_flight + e.comm_buffers, (2 * units[2] + units[2] + units[3]) * 4);
  EXPECT_EQ(e.gathered_in_flight + e.comm_buffers, 657'152);
  // From the second micro-step on, reductions add into the owned shard through a scratch: the final
  // unit's, in flight while the second layer's backward runs. (The comm peak measured at 2x64 per rank and
  // 2 micro-steps is that of one micro-step, 657,152 bytes: the final unit's small reduction had landed.)
  in.grad_accum = 2;
  const MemoryEstimate accumulated = estimate_memory(in);
  EXPECT_EQ(accumulated.gathered_in_flight + accumulated.comm_buffers, 657'152 + units[3] / 4 * 4);
  in.grad_accum = 1;
  in.plan.max_inflight = 1;  // nothing prefetched: the first layer gathered beside its gradient and the second's
  const MemoryEstimate one = estimate_memory(in);
  EXPECT_EQ(one.gathered_in_flight + one.comm_buffers, 3 * units[1] * 4);
  EXPECT_EQ(one.gathered_in_flight + one.comm_buffers, 591'360);
}

// From the second micro-step on, a reduction adds into the owned shard through a shard-sized scratch.
// GPT-2 (2 layers, 1x32 per rank, 2 micro-steps, the head's weight gradient deferred) peaks at the
// embedding's reduction: its full gradient beside its scratch, above the two units gathered at the
// forward's start. zshard-bench measured these peaks per rank at np 4; the estimate had counted the two
// largest units' scratch on top of the larger of forward and backward (457,959,168 and 718,675,200).
TEST(MemoryEstimator, AccumulationScratchOpensBesideTheGradientItReduces) {
  const GPT2 model(two_layer_gpt2());
  EstimateInput in = zero3_on_4(model, 1, 32);
  in.grad_accum = 2;
  EXPECT_EQ(estimate_memory(in).total(), 422'519'808);
  in.plan.max_inflight = 1;
  EXPECT_EQ(estimate_memory(in).total(), 422'519'808);
  in.plan = plan(StrategyKind::hybrid, 4, 2);
  EXPECT_EQ(estimate_memory(in).total(), 676'147'968);
}

// Quantized reductions add, to what the unquantized ones hold, the chunk records (sent and received) of the
// two largest units' reductions, which may be in flight at once, on every strategy that reduce-scatters.
TEST(MemoryEstimator, QuantizedReductionsHoldTheRecordsOfTwoReductions) {
  const GPT2 model(two_layer_gpt2());
  for (StrategyKind kind : {StrategyKind::zero1, StrategyKind::zero2, StrategyKind::zero3}) {
    for (ReductionQuantization q : {ReductionQuantization::int8, ReductionQuantization::int4}) {
      EstimateInput in = zero3_on_4(model);
      in.plan = plan(kind, 4);
      const MemoryEstimate exact = estimate_memory(in);
      in.plan.quantize_reductions = q;
      std::vector<int64_t> records;
      for (const UnitSpec& unit : model.units())
        records.push_back(2 * 4 * quantized_chunk_bytes(FlatLayout(unit, 4), q));
      std::sort(records.rbegin(), records.rend());
      EXPECT_EQ(estimate_memory(in).comm_buffers, exact.comm_buffers + records[0] + records[1])
          << strategy_name(kind) << " " << reduction_quantization_name(q);
    }
  }
}

// Llama keeps a gradient open only with a tied head that adds its weight gradient at the head: from as
// many tokens per rank as channels (2048) on. Untied, its units are the embedding, the layers and the
// final unit (norm and lm_head). zero2 holds a kept gradient beside the two largest others; else the
// gradients of two units, or the largest alone, whichever is more.
TEST(MemoryEstimator, LlamaKeepsTheTiedEmbeddingGradientOpenOnlyAtTheHead) {
  for (const bool tied : {false, true})
    for (const int seq : {64, 2048}) {
      ModelConfig overrides;
      overrides.insert_or_assign("tie_embeddings", tied);
      const std::unique_ptr<Model> model = build_model("tinyllama-1.1b", model_config("tinyllama-1.1b", overrides));
      const bool kept = tied && seq >= 2048;
      EXPECT_EQ(model->keeps_gradients_open(1, seq), kept);
      std::vector<int64_t> units;
      for (const UnitSpec& u : model->units()) units.push_back(FlatLayout(u, 4).padded_numel());
      std::sort(units.rbegin(), units.rend());
      EstimateInput in;
      in.model = model.get();
      in.plan = plan(StrategyKind::zero2, 4);
      in.seq = seq;
      const MemoryEstimate e = estimate_memory(in);
      const int64_t want = kept ? units[0] + units[1] + units[2] : std::max(units[0], 2 * units[1]);
      EXPECT_EQ(e.comm_buffers, want * 4) << (tied ? "tied " : "untied ") << seq;
      EXPECT_EQ(e.activations, model->activation_bytes(1, seq, DType::f32));
    }
}

// llama-3.2-1b: tied, its 128256 x 2048 embedding over four times a layer; 4096 tokens keep the head's
// gradient open. The activations include the deferred dlogits' bytes.
TEST(MemoryEstimator, TiedLlamaCountsEveryTerm) {
  const LlamaConfig c = llama_config("llama-3.2-1b");
  const Llama model(c);
  const int64_t C = c.dim, embed = int64_t(c.vocab) * C;
  expect_tied_head_terms(model, embed, 2 * C + 2 * C * C + 2 * C * c.kv_dim() + 3 * C * c.ffn_dim, 32);
}

TEST(MemoryEstimator, LargestBatchFitsAndTheNextDoesNot) {
  const GPT2 model(gpt2_config("gpt2"));
  EstimateInput in;
  in.model = &model;
  in.plan = plan(StrategyKind::zero3, 8);
  in.seq = 1024;
  const int64_t device = int64_t(80) << 30;
  const int b = largest_rank_batch(in, device);
  ASSERT_GT(b, 0);
  in.rank_batch = b;
  EXPECT_LE(estimate_memory(in).total(), device);
  in.rank_batch = b + 1;
  EXPECT_GT(estimate_memory(in).total(), device);
  EXPECT_EQ(largest_rank_batch(in, 1000), 0);
  EstimateInput bare;
  bare.params = 1000;
  EXPECT_EQ(largest_rank_batch(bare, device), -1);
}

// A model of a user's own: GPT-2's units and activations, without recomputation (Model's default
// refuses blocks). Only sized, never run.
class WithoutRecompute final : public Model {
 public:
  explicit WithoutRecompute(const Model& sized_like) : inner_(sized_like) {}
  std::vector<UnitSpec> units() const override { return inner_.units(); }
  void init_unit(int, const UnitTensors&, uint64_t) const override {}
  double forward_backward(ParamContext&, const Batch&, float) override { return 0; }
  double forward(ParamContext&, const Batch&) override { return 0; }
  int64_t activation_bytes(int B, int T, DType dtype) const override { return inner_.activation_bytes(B, T, dtype); }
  int vocab_size() const override { return inner_.vocab_size(); }
  int context_length() const override { return inner_.context_length(); }

 private:
  const Model& inner_;
};

// --offload optimizer: master, m and v (12 bytes per owned parameter) in host memory, which on the cpu is
// the device's and counts in its total; with bf16 gradients, or on a GPU, the host also holds a copy of
// the owned gradients, and on a GPU none of it counts in the device's total. ZeRO-Offload's split has the
// same host bytes and keeps no gradients on the device.
TEST(MemoryEstimator, OffloadedOptimizerIsHostMemory) {
  EstimateInput in;
  in.params = 1'000'000;
  in.plan = plan(StrategyKind::zero2, 4);
  in.plan.placement.param_dtype = DType::bf16;
  in.plan.placement.offload_optimizer = true;
  const MemoryEstimate cpu = estimate_memory(in);
  EXPECT_EQ(cpu.model_states.optimizer, 0);
  EXPECT_EQ(cpu.model_states.host, (12 + 2) * 250'000);
  EXPECT_EQ(cpu.host_apart(), 0);
  EXPECT_EQ(cpu.total(), cpu.model_states.total());
  in.plan.placement.param_dtype = DType::f32;
  EXPECT_EQ(estimate_memory(in).model_states.host, 12 * 250'000);
  in.plan.placement.param_dtype = DType::bf16;
  in.plan.placement.device = Device::cuda;
  const MemoryEstimate gpu = estimate_memory(in);
  EXPECT_EQ(gpu.model_states.host, (12 + 2) * 250'000);
  EXPECT_EQ(gpu.host_apart(), gpu.model_states.host);
  EXPECT_EQ(gpu.total(), gpu.model_states.on_device());
  const ModelStateBytes zero_offload = predict_zero_offload(in.plan.kind, 4, in.params, DtypePolicy::mixed_bf16());
  EXPECT_EQ(zero_offload.host, gpu.model_states.host);
  EXPECT_EQ(zero_offload.on_device(), gpu.model_states.params);
}

// Asynchronous saves: only group 0's ranks hold a snapshot. With hybrid groups of 3 and 2, a rank of group
// 0 (a third of the states, plus the snapshot of that third: 28 bytes a parameter over 3) needs more than
// one of the smaller group 1 (16 over 2), and the default estimate, the rank that needs the most, is
// group 0's; without the snapshot, or with group 0 the smallest, it is the smallest group's.
TEST(MemoryEstimator, TheWorstRankIsTheSnapshotHoldersWhereThatNeedsMore) {
  const GPT2Config config = gpt2_config("tiny");
  const GPT2 model(config);
  const auto estimate = [&](std::vector<int> groups, bool snapshot, int group) {
    PlanOptions o;
    o.strategy.kind = StrategyKind::hybrid;
    o.strategy.shard_group = ShardGroupRequest::list(groups);
    EstimateInput in;
    in.model = &model;
    in.plan = plan_for_world(o, 5);
    in.checkpoint_snapshot = snapshot;
    in.group = group;
    return estimate_memory(in);
  };
  const MemoryEstimate first = estimate({3, 2}, true, 0), second = estimate({3, 2}, true, 1);
  EXPECT_GT(first.checkpoint_snapshot, 0);
  EXPECT_EQ(second.checkpoint_snapshot, 0);
  ASSERT_GT(first.total(), second.total());
  const MemoryEstimate worst = estimate({3, 2}, true, -1);
  EXPECT_EQ(worst.shard_group, 3);
  EXPECT_EQ(worst.total(), first.total());
  EXPECT_EQ(estimate({3, 2}, false, -1).shard_group, 2);
  const MemoryEstimate smallest_first = estimate({2, 3}, true, -1);
  EXPECT_EQ(smallest_first.shard_group, 2);
  EXPECT_GT(smallest_first.checkpoint_snapshot, 0);
}

// zshard-mem --max-batch: each batch is the largest that fits under its savers, by the estimate itself.
TEST(MemoryEstimator, LargestBatchPerSaverFitsAndTheNextDoesNot) {
  GPT2 model(gpt2_config("gpt2"));
  const int64_t budget = int64_t(4) << 30;
  for (StrategyKind kind : {StrategyKind::ddp, StrategyKind::zero2, StrategyKind::zero3}) {
    SCOPED_TRACE(strategy_name(kind));
    EstimateInput in;
    in.plan = plan(kind, 4);
    in.seq = 256;
    const std::vector<int> batches = largest_rank_batch_per_saver(in, model, budget);
    ASSERT_EQ(batches.size(), std::size(kAllMemorySavers));
    in.model = &model;
    for (size_t i = 0; i < batches.size(); ++i) {
      SCOPED_TRACE(kAllMemorySavers[i].name());
      ASSERT_GT(batches[i], 0);
      model.set_recompute(kAllMemorySavers[i].recompute);
      in.plan.placement.offload_optimizer = kAllMemorySavers[i].offload_optimizer;
      in.rank_batch = batches[i];
      EXPECT_LE(estimate_memory(in).total(), budget);
      in.rank_batch = batches[i] + 1;
      EXPECT_GT(estimate_memory(in).total(), budget);
    }
    // Recomputing blocks only ever frees activations. fp32 offload moves the 8 bytes per parameter of Adam
    // to the host but adds a 4-byte master there: with the host counted, it fits no more.
    EXPECT_GT(batches[1], batches[0]);
    EXPECT_GT(batches[3], batches[2]);
    EXPECT_LE(batches[2], batches[0]);
    EXPECT_LE(batches[3], batches[1]);
  }
  model.set_recompute(Recompute::none);
  WithoutRecompute own(model);
  EstimateInput in;
  in.plan = plan(StrategyKind::ddp, 4);
  in.seq = 256;
  const std::vector<int> batches = largest_rank_batch_per_saver(in, own, budget);
  EXPECT_GT(batches[0], 0);
  EXPECT_EQ(batches[1], -1);
  EXPECT_GT(batches[2], 0);
  EXPECT_EQ(batches[3], -1);
}

TEST(MemoryEstimator, ParsesSizes) {
  EXPECT_EQ(parse_bytes("80GiB", "--device-mem"), int64_t(80) << 30);
  EXPECT_EQ(parse_bytes("40GB", "--device-mem"), int64_t(40'000'000'000));
  EXPECT_EQ(parse_bytes("1.5e9", "--device-mem"), int64_t(1'500'000'000));
  EXPECT_EQ(parse_bytes("512mib", "--device-mem"), int64_t(512) << 20);
  try {
    parse_bytes("80 furlongs", "--device-mem");
    FAIL() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--device-mem"), std::string::npos);
  }
  EXPECT_THROW(parse_bytes("-1GB", "--device-mem"), UsageError);
  EXPECT_THROW(parse_bytes("0.5", "--min-size"), UsageError);  // would truncate to 0 bytes
  EXPECT_EQ(parse_bytes("0.5KiB", "--min-size"), 512);
  EXPECT_THROW(parse_dtype_policy("fp8"), UsageError);
}

}  // namespace
}  // namespace zshard
