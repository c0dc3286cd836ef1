// zshard-tune's cost model: the step time of a candidate as compute + exposed communication + optimizer.
//   compute        the slowest rank's sequences per step times its seconds per sequence, times the
//                  recompute of --activation-checkpointing blocks (one more forward of the blocks: the
//                  model's FLOPs say how much)
//   communication  the projection's alpha-beta terms: a latency per collective call (one per unit and
//                  pass) plus the ZeRO volume of the strategy per step (shard/comm_volume.h: ddp and zero1
//                  once per step, zero2, zero3 and hybrid every micro-step, zero3 gathering once per
//                  micro-step when it keeps gathered units from forward to backward; the candidate's
//                  quantized gathers and reductions and secondary groups as the volume counts them) over
//                  the bandwidth, one rate for every link (a secondary shard gains its bytes, not a faster
//                  link); a fraction of it is exposed, and all of zero3's and hybrid's gathers when
//                  nothing prefetches them (--max-inflight 1)
//   optimizer      AdamW over the parameters the rank owns (all of them under ddp)
// Before any run the rates are nominal; one short measured run of one candidate (zshard-bench's JSON)
// calibrates every rate: each rank's seconds per sequence, the latency per call, the bytes per millisecond
// and the exposed fraction of its collectives, and the optimizer's time per owned parameter. Offload
// changes no term: on the cpu it is the same AdamW on the same cores; on a GPU its transfers overlap
// backward and the host's step is not modelled.
#pragma once
#include <vector>

#include "runtime/planning/tune_space.h"

namespace zshard {

// What zshard-bench measured for one candidate (its JSON result).
struct MeasuredRun {
  double step_ms = 0;               // median step
  std::vector<double> seq_per_s;    // each rank's sequences per second of compute
  double comm_exposed_ms = 0;       // per step, blocked in collectives
  double comm_total_ms = 0;         // per step, the same collectives replayed alone
  double comm_latency_ms = 0;       // per step, the same calls replayed at one element each
};

struct Calibration {
  std::vector<double> seconds_per_seq;  // per rank, without checkpointing's recompute
  double comm_bytes_per_ms = 0;
  double comm_ms_per_call = 0;
  double exposed_fraction = 1;  // of the collectives that run beside compute
  double optimizer_ms_per_param = 0;
  bool measured = false;
};

struct StepCost {
  double compute_ms = 0;
  double comm_ms = 0;  // exposed
  double optimizer_ms = 0;
  double step_ms() const { return compute_ms + comm_ms + optimizer_ms; }
};

// Rates for a first ranking, before anything ran: what a core (cpu) or a GPU (cuda) roughly does.
Calibration nominal_calibration(const TuneProblem& problem);
// The rates that make `measured` the prediction for `ran`.
Calibration calibrate(const TuneProblem& problem, const Candidate& ran, const MeasuredRun& measured);
StepCost predict_step(const TuneProblem& problem, const Candidate& c, const Calibration& rates);

// Compute with --activation-checkpointing blocks over compute without: 1 + the blocks' forward share of a
// step's FLOPs (the units between the first and the last are the blocks).
double recompute_factor(const Model& model, int seq);
// Each rank's sequences per micro-step: even, or for an auto split in proportion to the measured speeds
// within max_rank_batch (as --rank-batches auto converges to).
std::vector<int> predicted_split(const Candidate& c, int world, const std::vector<double>& seconds_per_seq);
// Whether the ranks' measured speeds differ enough (more than 20%, beyond a loaded machine's noise) for an
// auto split to pay.
bool unequal_speeds(const Calibration& rates);

}  // namespace zshard
