// zshard-tune's search space: every configuration of one model on one set of ranks that trains the same
// global batch (strategy, hybrid's shard groups, micro-batch with gradient accumulation, activation
// checkpointing, optimizer offload, prefetch depth, resharding after forward, the communication modes,
// the batch's split over the ranks), each with the memory estimator's peak per rank, so that those over
// the budget are pruned before anything runs. Arithmetic only.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <zshard/model.h>

#include "shard/memory/estimator.h"

namespace zshard {

// What is being tuned: the model, the ranks, the global batch and the memory each rank may use.
struct TuneProblem {
  Model* model = nullptr;  // the estimate sets its checkpointing mode per candidate, and leaves it at none
  int world = 1;
  std::vector<int> hosts;  // ranks per host in rank order (hybrid's node groups); empty: one host
  int global_batch = 1;    // sequences per optimizer step
  int seq = 64;
  DType param_dtype = DType::f32;  // bf16: mixed precision (bf16 compute, fp32 master and AdamW)
  Device device = Device::cpu;
  int64_t budget = 0;  // bytes per rank
  std::vector<std::string> freeze;  // EngineOptions::freeze
};

// The values each dimension may take. An empty grad_accums means every one that divides the batch.
struct TuneSpace {
  std::vector<StrategyKind> strategies = {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2,
                                          StrategyKind::zero3, StrategyKind::hybrid};
  std::vector<int> grad_accums;
  std::vector<Recompute> checkpointing = {Recompute::none,
                                                        Recompute::blocks};
  std::vector<bool> offload = {false, true};
  std::vector<int> max_inflight = {2, 1};     // zero3 and hybrid only
  std::vector<bool> reshard = {true, false};  // zero3 and hybrid only
  // The communication modes, the runtime's alone by default: int8 gathers for zero3 and hybrid, quantized
  // reductions for all but ddp, the secondary shard for zero3.
  std::vector<GatherQuantization> quantize_gathers = {GatherQuantization::none};
  std::vector<ReductionQuantization> quantize_reductions = {ReductionQuantization::none};
  std::vector<SecondaryShard> secondary_shard = {SecondaryShard{}};
  std::vector<bool> auto_split = {false};     // --rank-batches even (false) and/or auto (true)
};

struct Candidate {
  StrategyKind kind = StrategyKind::ddp;
  std::vector<int> groups;  // hybrid: the shard groups' sizes in rank order
  int batch = 1;            // global sequences per micro-step (--batch)
  int grad_accum = 1;
  Recompute checkpointing = Recompute::none;
  bool offload = false;
  int max_inflight = 2;
  bool reshard_after_forward = true;
  bool auto_split = false;
  // --rank-batches auto: the most sequences one rank may take (--max-rank-batch), what fits the budget.
  int max_rank_batch = 0;
  GatherQuantization quantize_gathers = GatherQuantization::none;
  ReductionQuantization quantize_reductions = ReductionQuantization::none;
  SecondaryShard secondary_shard{};

  // "zero3 G4 8x2 blocks offload inflight 1 keep gathers-int8 reductions-int4 secondary-host auto": what
  // differs from the defaults.
  std::string label() const;
  // The zshard-train flags that select it (zshard-bench takes the same, with --strategies).
  std::vector<std::string> train_flags() const;
  bool operator==(const Candidate&) const = default;
};

// The shard groups hybrid may use on `problem`'s ranks: the hosts' sizes when there are several hosts,
// else every group size G with 1 < G < world dividing it.
std::vector<std::vector<int>> hybrid_groupings(const TuneProblem& problem);

// The plan the runtime would make for the candidate on `problem`'s hosts; throws UsageError where it
// refuses it, in its words.
ShardPlan candidate_plan(const TuneProblem& problem, const Candidate& c);

// Every candidate of `space`, simplest first (strategies in the order given, fewest micro-steps first,
// checkpointing, offload, prefetch depth, resharding and the communication modes in their lists' order).
// A mode applies to the strategies that take it (the others keep none); a candidate the runtime refuses
// (a secondary shard without resharding, or of a size that does not divide the world) is skipped, and so
// is a secondary shard whose plan has none (one host). Throws UsageError when the global batch cannot be
// cut as asked: not a multiple of the world, or a --grad-accum that does not divide the sequences per
// rank, or checkpointing only for a model that cannot recompute, or when every candidate of a strategy
// is skipped (naming the first skip's reason). Candidates with an auto split get their max_rank_batch
// from the budget.
std::vector<Candidate> enumerate_candidates(const TuneProblem& problem, const TuneSpace& space);

// The estimator's peak per rank for the candidate: the one call from the tuner into the estimator. For
// an auto split, at the most sequences a rank may take.
MemoryEstimate estimate_candidate(const TuneProblem& problem, const Candidate& c);
bool fits(const TuneProblem& problem, const Candidate& c);

// The largest sequences per rank and micro-step whose estimate fits the budget with the candidate's other
// settings (0: none).
int largest_fitting_rank_batch(const TuneProblem& problem, const Candidate& c);

}  // namespace zshard
