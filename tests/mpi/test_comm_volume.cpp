// The bytes every strategy moves per step, counted by the communicator, equal the memory report's theory
// for each model: the ZeRO volumes, with zero3's all-gathers taken from the model's own gather schedule.
// That schedule is pinned too: GPT-2 and a tied Llama gather every unit twice per micro-step, an untied
// Llama gathers its embedding and its head unit once each, and without resharding after forward every
// unit is gathered once. An evaluation gathers what its forward reads. The report's gathered units in
// flight are the estimator's (zshard-mem's). Quantized gathers (int8 with a scale per block) move and
// hold what the theory says of them too, and so do quantized reductions (int8 or int4 chunks exchanged
// by an all-to-all), closer still with the blocks of the model's own parameters counted, and so do
// backward's gathers inside secondary groups (--secondary-shard).
// zshard-test-np: 1 2 4
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include <zshard/memory_report.h>

#include "shard/memory/estimator.h"
#include "shard/engine_internals.h"
#include "shard/gather_quantization.h"
#include "tests/support/test_support.h"
#include "tests/support/training_runs.h"

namespace zshard {
namespace {

TrainOptions options(const std::string& model, bool tied) {
  TrainOptions o = test::tiny_options(2);
  o.model.name = model;
  if (tied) o.model.overrides["tie_embeddings"] = 1;
  o.data.grad_accum = 2;  // zero2 and zero3 move their volume every micro-step
  return o;
}

std::vector<StrategyOptions> strategies(int world) {
  std::vector<StrategyOptions> out;
  for (StrategyKind k : {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2, StrategyKind::zero3})
    out.push_back({k, {}, true, 2});
  out.push_back({StrategyKind::zero3, {}, false, 2});
  out.push_back({StrategyKind::hybrid, ShardGroupRequest::equal(world % 2 == 0 ? 2 : 1), true, 2});
  // Quantization needs a shard group of two or more to carry it: a world of one and hybrid's groups of
  // one refuse it.
  const StrategyOptions zero3 = out[3], hybrid = out.back();
  const bool peers = world > 1, hybrid_peers = world % 2 == 0;
  for (const auto& [quantized, carried] : {std::pair{zero3, peers}, std::pair{hybrid, hybrid_peers}})
    if (carried) {
      out.push_back(quantized);
      out.back().quantize_gathers = GatherQuantization::int8;
    }
  const auto reductions = [](StrategyOptions s, ReductionQuantization q) {
    s.quantize_reductions = q;
    return s;
  };
  if (peers) {
    out.push_back(reductions(out[1], ReductionQuantization::int8));  // zero1
    out.push_back(reductions(out[2], ReductionQuantization::int4));  // zero2
  }
  if (hybrid_peers) out.push_back(reductions(hybrid, ReductionQuantization::int8));
  if (world == 4)
    for (StrategyOptions paired : {zero3, out[6]}) {  // zero3, unquantized and quantized gathers
      paired.secondary_shard = {SecondaryShard::Kind::size, 2};
      out.push_back(paired);
    }
  return out;
}

struct Case {
  std::string model;
  bool tied;
  // Units gathered once per micro-step with resharding after forward (the rest twice).
  std::vector<int> gathered_once;  // negative: counted from the last unit
};

TEST(CommVolume, MeasuredBytesEqualTheTheoryForEveryModelAndStrategy) {
  const int n = test::world().size();
  for (const Case& c : {Case{"tiny", false, {}}, Case{"llama-tiny", false, {0, -1}}, Case{"llama-tiny", true, {}}}) {
    for (const StrategyOptions& s : strategies(n)) {
      TrainOptions o = options(c.model, c.tied);
      o.plan.strategy = s;
      const bool quantized = s.quantize_gathers == GatherQuantization::int8;
      const std::string what = c.model + (c.tied ? " tied " : " ") + test::describe(s) +
                               (s.reshard_after_forward ? "" : " kept after forward");
      Trainer trainer(o, test::world());
      trainer.run(nullptr);
      const ShardedParams& params = EngineInternals::params(trainer.engine());
      if (trainer.plan().params_sharded()) {
        int64_t psi = 0, want = 0;
        const int units = params.num_units();
        for (int u = 0; u < units; ++u) psi += params.layout(u).numel();
        if (!s.reshard_after_forward) {
          want = psi;
        } else {
          want = 2 * psi;
          for (int u : c.gathered_once) want -= params.layout(u < 0 ? units + u : u).numel();
        }
        EXPECT_EQ(params.gathered_numel_per_micro_step(), want) << what;
        // With secondary groups every gather after a unit's first comes from the shares its release kept.
        EXPECT_EQ(params.secondary_gathered_numel_per_micro_step(),
                  s.secondary_shard.kind == SecondaryShard::Kind::none ? 0 : want - psi)
            << what;
      }
      const MemoryReport report = trainer.engine().memory_report();
      // Gathered units in flight, counted here: the max_inflight largest padded units (all of them when
      // they stay gathered after forward), fp32, and quantized, beside each the group's records it
      // lands in. The report and the estimator must both say so.
      std::vector<int64_t> sizes;
      for (int u = 0; u < params.num_units(); ++u) {
        const FlatLayout& l = params.layout(u);
        const int64_t record = quantized_shard_bytes(l);
        sizes.push_back(4 * l.padded_numel() + (quantized ? l.group_size() * record : 0));
      }
      std::sort(sizes.rbegin(), sizes.rend());
      const size_t held = s.reshard_after_forward ? size_t(s.max_inflight) : sizes.size();
      const int64_t in_flight =
          trainer.plan().params_sharded() ? std::accumulate(sizes.begin(), sizes.begin() + held, int64_t(0)) : 0;
      EstimateInput in;
      in.model = &trainer.model();
      in.plan = trainer.plan();
      in.group = trainer.plan().groups.group_of(0);
      EXPECT_EQ(report.predicted_inflight, in_flight) << what;
      EXPECT_EQ(estimate_memory(in).gathered_in_flight, in_flight) << what;
      for (int r = 0; r < n; ++r) {
        // The theory counts real elements; the wire also carries the padding (under n per unit).
        const double theory = double(report.ranks[r].predicted_comm_bytes);
        EXPECT_NEAR(report.ranks[r].comm_bytes_per_step, theory, 2e-3 * theory) << what << ", rank " << r;
        // Quantized records carry the padding and one more scale for each parameter's short last block, and
        // the theory counts them from the units' own blocks: closer than the nominal bytes an element.
        if (quantized || s.quantize_reductions != ReductionQuantization::none)
          EXPECT_NEAR(report.ranks[r].comm_bytes_per_step, theory, 1e-4 * theory) << what << ", rank " << r;
      }
    }
  }
}

// An evaluation's forward-only passes gather what their forward reads and nothing more: they prefetch
// along an order of their own, so the end of forward does not prefetch what training's backward would
// gather next (an untied Llama's last layer). GPT-2's forward gathers the embedding twice (the tied head).
TEST(CommVolume, EvaluationGathersOnlyWhatItsForwardReads) {
  const int n = test::world().size();
  for (const Case& c : {Case{"tiny", false, {}}, Case{"llama-tiny", false, {}}}) {
    TrainOptions o = options(c.model, c.tied);
    o.plan.strategy = {StrategyKind::zero3, {}, true, 2};
    o.eval.source = "default";
    o.eval.every = 100;  // never within the run: evaluate() is called below
    o.eval.batches = 3;
    Trainer trainer(o, test::world());
    trainer.run(nullptr);
    const ShardedParams& params = EngineInternals::params(trainer.engine());
    int64_t forward = 0;
    for (int u = 0; u < params.num_units(); ++u) forward += params.layout(u).numel();
    if (c.model == "tiny") forward += params.layout(0).numel();
    const int64_t before = params.comm_stats().total_bytes();
    trainer.evaluate();
    // The theory counts real elements; the wire also carries the padding (under n per unit), and the
    // loss's all-reduce is on the world, not the params' communicators. An evaluation batch is a step's
    // sequences: grad_accum forward passes.
    const double moved = double(params.comm_stats().total_bytes() - before);
    const double want = double(o.eval.batches) * o.data.grad_accum * double(forward) * 4 * (n - 1) / n;
    EXPECT_NEAR(moved, want, 2e-3 * want) << c.model;
  }
}

}  // namespace
}  // namespace zshard
