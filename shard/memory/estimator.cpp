#include "shard/memory/estimator.h"

#include <algorithm>
#include <numeric>
#include <cctype>
#include <cmath>
#include <functional>
#include <iomanip>
#include <sstream>

#include <zshard/error.h>

#include "shard/checkpoint_format.h"
#include "shard/chunk_blocks.h"
#include "shard/flat_unit.h"
#include "shard/frozen_params.h"
#include "shard/gather_quantization.h"
#include "shard/reduction_quantization.h"

namespace zshard {

MemoryEstimate estimate_memory(const EstimateInput& in) {
  const ShardPlan& plan = in.plan;
  const ShardGroups& groups = plan.groups;
  int group = in.group;
  if (group < 0) {
    EstimateInput one = in;
    one.group = int(std::min_element(groups.sizes().begin(), groups.sizes().end()) - groups.sizes().begin());
    const MemoryEstimate smallest = estimate_memory(one);
    if (!in.checkpoint_snapshot || one.group == 0) return smallest;
    one.group = 0;
    const MemoryEstimate first = estimate_memory(one);
    return first.total() > smallest.total() ? first : smallest;
  }
  if (group >= groups.count()) refuse("no shard group ", group, " among ", groups.count());
  MemoryEstimate e;
  const Device device = plan.placement.device;
  const bool offload = plan.placement.offload_optimizer;
  e.device = device;
  e.shard_group = groups.size(group);
  const int G = e.shard_group;
  const DtypePolicy d = DtypePolicy::of(plan.placement.param_dtype, plan.quantize_gathers, plan.quantize_reductions);
  if (!in.model) {
    e.params = in.params;
    e.model_states = predict_model_states(plan.kind, G, in.params, d, offload, device);
    return e;
  }

  // Per-unit padding by the code that shards the units: a unit's trainable and frozen parameters are two
  // flat buffers (shard/frozen_params.h), gathered together, the trainable ones alone with gradients.
  // gathered_units are bytes: what a gather of the unit holds (with quantized gathers, the records too).
  std::vector<int64_t> units, gathered_units, reduction_records, secondary_shares;
  // Secondary groups: the share a rank keeps of each unit between its forward and backward, in the
  // smallest group (the largest share).
  int secondary_group = 0;
  if (plan.secondary_groups)
    for (int h : plan.secondary_groups->sizes()) secondary_group = secondary_group ? std::min(secondary_group, h) : h;
  const auto share_bytes = [&](const FlatLayout& l) {
    return l.numel() > 0 ? l.share_numel(secondary_group) * d.param_bytes : 0;
  };
  std::vector<FlatLayout> layouts;
  // With quantized gathers, each buffer's record of its own shard and its chunks' block tables; with
  // quantized reductions, the trainable buffer's tables (shard/chunk_blocks.h), kept with the gradients.
  int64_t padded_total = 0;
  const bool quantized = d.quantized_gathers && plan.params_sharded();
  const bool quantized_reductions = d.quantized_reductions != ReductionQuantization::none && G > 1;
  const auto gather_record_and_tables = [](const FlatLayout& l) {
    return quantized_shard_bytes(l) + ChunkBlockTables::bytes(l, kGatherQuantFormat);
  };
  const bool p_sharded = plan.params_sharded(), g_sharded = plan.grads_sharded();
  // The model states are counted unit by unit, as set-up (shard/sharded_params.cpp) makes them: it then has
  // the model write the whole unit's values in fp32, in the unit's own buffers where they hold it whole in
  // fp32 on the host, else in a staging of the unit on the host, uploaded from there (on a GPU through a
  // device staging of what the rank keeps, for bf16). Set-up's peak is a unit's staging beside the states
  // made so far.
  ModelStateBytes& states = e.model_states;
  int64_t import_staging = 0;  // the largest of the buffers an import reads in, one at a time
  for (const UnitSpec& unit : freeze_matching(in.model->units(), in.freeze)) {
    const UnitSplit split = split_unit(unit);
    const FlatLayout& layout = layouts.emplace_back(split.trainable, G, groups.pad_multiple());
    const FlatLayout frozen(split.frozen, G, groups.pad_multiple());
    const int64_t frozen_padded = frozen.numel() > 0 ? frozen.padded_numel() : 0;
    e.params += layout.numel() + frozen.numel();
    e.frozen_params += frozen.numel();
    units.push_back(layout.padded_numel());
    gathered_units.push_back(unit_gathered_bytes(layout, frozen, d.param_bytes, quantized));
    if (secondary_group > 0) secondary_shares.push_back(share_bytes(layout) + share_bytes(frozen));
    padded_total += units.back();
    const int64_t unit_shard = units.back() / G;
    const int64_t kept_params = p_sharded ? unit_shard : units.back(), kept_frozen = p_sharded ? frozen_padded / G : frozen_padded;
    states.params += kept_params * d.param_bytes;
    states.frozen += kept_frozen * d.param_bytes;
    if (quantized && layout.numel() > 0) states.params += gather_record_and_tables(layout);
    if (quantized && frozen_padded > 0) states.frozen += gather_record_and_tables(frozen);
    states.grads += (g_sharded ? unit_shard : units.back()) * d.grad_bytes;
    if (quantized_reductions && layout.numel() > 0) {
      reduction_records.push_back(2 * G * quantized_chunk_bytes(layout, d.quantized_reductions));
      states.grads += ChunkBlockTables::bytes(layout, reduction_quant_format(d.quantized_reductions));
    }
    (offload ? states.host : states.optimizer) +=
        unit_shard * (offload ? offloaded_bytes_per_param(d, device) : d.optimizer_bytes);
    const bool fp32 = d.param_bytes == 4;
    const int64_t staging = device == Device::cpu ? (!p_sharded && fp32 ? 0 : (units.back() + frozen_padded) * 4)
                                                  : (fp32 ? 0 : std::max(kept_params, kept_frozen) * 4);
    e.set_up = std::max(e.set_up, (device == Device::cpu ? states.total() : states.on_device()) + staging);
    // An import reads each buffer whole into host memory and uploads it as above: on the cpu that read is
    // the device's memory; on a GPU the estimate counts the device's staging only, the host's being apart.
    import_staging = std::max(import_staging, device == Device::cpu ? std::max(units.back(), frozen_padded) * 4
                                                                     : (fp32 ? 0 : std::max(kept_params, kept_frozen) * 4));
  }
  if (in.imports_weights)
    e.set_up = std::max(e.set_up, (device == Device::cpu ? states.total() : states.on_device()) + import_staging);
  if (in.checkpoint_snapshot) e.checkpoint_snapshot = checkpoint_snapshot_bytes(layouts, group);

  if (p_sharded)
    e.gathered_in_flight = predict_gathered_bytes(gathered_units, plan.max_inflight, plan.reshard_after_forward);
  // Transient full gradients and reduce-scatter outputs (shard/sharded_params.cpp). Sharded gradients:
  // a unit's reduction is finished once the next one is issued, and a unit opens its full gradient only
  // once those in flight fit beside it within max(L1, 2 L2) elements (L1, L2 the two largest units): the
  // unit being accumulated and the one in flight, or the largest alone. A model that keeps a unit's
  // gradient open through backward (Model::keeps_gradients_open: a tied head adding to the embedding
  // first) holds it, taken as the largest, beside the two largest others. Backward runs the units in
  // reverse: unit u's gradient opens beside u+1's in flight when the two fit that bound. zero3/hybrid
  // hold gathered units too, the larger of the forward's (the --max-inflight largest, no gradient open but
  // a kept one, which opens at the head) and backward's: u under its gather with the units before it
  // prefetched up to --max-inflight, down to the first block (an embedding's backward gathers nothing),
  // beside u's gradients; without resharding after forward, every unit from 0 to u is still gathered.
  // Reductions land in the owned shard on a step's first micro-step; later micro-steps add a shard-sized
  // scratch per reduction in flight (zero2: those of the two largest units; zero3/hybrid: u+1's while u's
  // backward runs, and u's own beside it once u's gathered copy is released at its grads_ready). zero1:
  // the scratch of its two reductions in flight, on the last micro-step; ddp reduces in place.
  // Gradients reduced in a dtype other than their own (bf16 kept, fp32 reduced, the default beside bf16
  // parameters) are first converted, whole, into a buffer of the reduce dtype, and reduced into a scratch
  // of it, never in place: two such buffers and scratches while reductions are in flight, every unit's
  // under ddp on a GPU, which finishes its reductions at the micro-step's end only.
  // Quantized, the chunks are cut from the gradient as it is, but the reduced shard is still of the reduce
  // dtype: a scratch apart from an owned shard of another dtype, quantized or not.
  const int64_t reduce_bytes = int64_t(dtype_size(plan.placement.reduce_dtype));
  const bool converts = reduce_bytes != d.grad_bytes && (G > 1 || groups.count() > 1) && !quantized_reductions;
  const int64_t scratch_bytes = reduce_bytes;
  const bool lands_apart = in.grad_accum > 1 || reduce_bytes != d.grad_bytes;
  const int64_t in_flight_shards = lands_apart && G > 1 ? sum_of_largest(units, 2) / G : 0;
  const int64_t L1 = sum_of_largest(units, 1), L2 = sum_of_largest(units, 2) - L1;
  const bool keeps_open = in.model->keeps_gradients_open(std::max(1, in.rank_batch), in.seq);
  const int64_t kept = keeps_open ? L1 : 0;
  const int64_t accumulated_and_in_flight = keeps_open ? sum_of_largest(units, 3) - L1 : std::max(L1, 2 * L2);
  // Full gradients open at unit u's backward, a kept one aside. Which unit is kept is not known (it is
  // counted as the largest): beside one, any two others may be open.
  const int64_t open_bound = keeps_open ? sum_of_largest(units, 2) : accumulated_and_in_flight;
  const int64_t first_in_backward = units.empty() ? 0 : units.back();
  const auto open_at = [&](size_t u) {
    const int64_t next = u + 1 < units.size() ? units[u + 1] : 0;
    return units[u] + (units[u] + next <= open_bound ? next : 0);
  };
  // Forward's end holds every unit's share beside the gathers in flight (a tied head's, the largest).
  const int64_t forward_shares = std::accumulate(secondary_shares.begin(), secondary_shares.end(), int64_t{0});
  if (p_sharded) {
    int64_t backward = 0, held = 0, shares = 0;
    for (size_t u = 0; u < units.size(); ++u) {
      held += gathered_units[u];
      int64_t gathered = held;  // kept from forward: every unit from 0 to u
      if (plan.reshard_after_forward) {
        // With secondary groups, the shares of every unit from 0 to u, kept from forward (a bound: u's
        // goes once its gather lands).
        shares += secondary_shares.empty() ? 0 : secondary_shares[u];
        gathered = shares;
        for (size_t v = u; v >= 1 && u - v < size_t(std::max(1, plan.max_inflight)); --v) gathered += gathered_units[v];
      }
      const int64_t open = open_at(u);
      if (in_flight_shards == 0) {
        backward = std::max(backward, gathered + open * d.grad_bytes);
        continue;
      }
      // Reductions through a scratch: u+1's in flight while u's backward runs; from u's grads_ready on,
      // u's too, its gathered copy released by then (an embedding's, gathered for nothing, frees nothing).
      const int64_t released = plan.reshard_after_forward && u >= 1 ? gathered_units[u] : 0;
      backward = std::max({backward, gathered + open * d.grad_bytes + (open - units[u]) / G * scratch_bytes,
                           gathered - released + open * d.grad_bytes + open / G * scratch_bytes});
    }
    e.comm_buffers = kept * d.grad_bytes + std::max(forward_shares, backward - e.gathered_in_flight);
    e.comm_before_reductions = kept * d.grad_bytes + forward_shares + first_in_backward * d.grad_bytes;
  } else if (g_sharded) {
    e.comm_buffers = (kept + accumulated_and_in_flight) * d.grad_bytes + in_flight_shards * scratch_bytes;
    e.comm_before_reductions = (kept + first_in_backward) * d.grad_bytes;
  } else if (G > 1) {
    e.comm_buffers = sum_of_largest(units, 2) / G * scratch_bytes;
  }
  const bool every_unit_in_flight = G == 1 && !g_sharded && device != Device::cpu;
  if (converts) e.comm_buffers += (every_unit_in_flight ? padded_total : sum_of_largest(units, 2)) * reduce_bytes;
  // A reduced shard of another dtype than the sharded gradients it is added to is converted first, beside
  // the buffers of its reduction (shard/sharded_params.h's accumulate): one at a time.
  if (g_sharded && reduce_bytes != d.grad_bytes) e.comm_buffers += L1 / G * d.grad_bytes;
  // Quantized reductions: a reduction in flight also holds its chunk records, those it sends and those it
  // receives, and two are in flight at most (a unit's, issued before the previous one's is finished).
  e.comm_buffers += sum_of_largest(reduction_records, 2);
  // ddp's all-reduces are the mpi backend's rings on the cpu: each receives into a chunk of scratch, 1/R
  // of its unit, while it runs, and a communicator runs one at a time (comm/ring_reduction.h): the largest
  // unit's at most. Its reduce-scatters allocate nothing. Hybrid's all-reduce of a shard across groups
  // takes its chunk once the unit's full gradient, G*R times its size, is gone (shard/grad_reduction.cpp):
  // inside the bounds above. On a GPU NCCL's buffers are its own.
  const int R = groups.count();
  const auto ring_chunk = [&](const std::vector<int64_t>& of) {
    return device == Device::cpu && R > 1 && !g_sharded ? (sum_of_largest(of, 1) + R - 1) / R * reduce_bytes : 0;
  };
  e.comm_buffers += ring_chunk(units);
  // Before the step's first reduction only gradients are open, none of a reduction's buffers: under sharded
  // gradients a kept one and the first unit of backward's (the last), beside forward's shares.
  e.comm_before_reductions = std::min(e.comm_before_reductions, e.comm_buffers);
  // The backward of the unit made ready last, unit 0 (an embedding's, and a deferred head's weight
  // gradient), runs beside the other units' reductions, not its own, which follows it: unit 0's gradient
  // open beside unit 1's in flight, and the buffers of the others' reductions.
  const std::vector<int64_t> others(units.begin() + std::min<ptrdiff_t>(1, ptrdiff_t(units.size())), units.end());
  int64_t last = 0;
  if (g_sharded && !units.empty()) {
    const int64_t open = open_at(0), shards = lands_apart && G > 1 ? sum_of_largest(others, 2) / G : 0;
    last = kept * d.grad_bytes + std::max(p_sharded ? forward_shares : 0, open * d.grad_bytes + shards * scratch_bytes);
  } else if (G > 1) {
    last = sum_of_largest(others, 2) / G * scratch_bytes;
  }
  if (converts)
    last += (every_unit_in_flight ? padded_total - (units.empty() ? 0 : units[0]) : sum_of_largest(others, 2)) *
            reduce_bytes;
  if (g_sharded && reduce_bytes != d.grad_bytes) last += sum_of_largest(others, 1) / G * d.grad_bytes;
  last += ring_chunk(others);
  e.comm_at_last_unit = std::min(last + sum_of_largest(reduction_records, 2), e.comm_buffers);

  const DType act = d.param_bytes == 2 ? DType::bf16 : DType::f32;
  e.activations = in.model->activation_bytes(std::max(1, in.rank_batch), in.seq, act);
  const WorkspaceBytes workspace = in.model->workspace_bytes(std::max(1, in.rank_batch), in.seq, act, device);
  // On cuda every GEMM call is handed cuBLAS's scratch (kernels/cuda/linear.cu), in every phase, beside
  // whatever the op around it holds: the size of cuBLAS's own pool on Hopper, the larger of the two it has.
  constexpr int64_t kCublasScratch = int64_t(32) << 20;
  const int64_t gemm = device == Device::cuda ? kCublasScratch : 0;
  e.op_scratch = workspace.most() + gemm;
  e.op_scratch_reducing = workspace.during_reductions + gemm;
  e.op_scratch_last_unit = workspace.last_unit + gemm;
  return e;
}

int largest_rank_batch(EstimateInput in, int64_t device_bytes) {
  if (!in.model) return -1;
  // The estimate grows with the batch through activations, linearly: double, then bisect. It may also
  // step where a model starts keeping a gradient open (GPT-2 and a tied Llama from dim tokens on, when the
  // scratch of their deferred head leaves the activations), or dip where an op's copies reach their bound
  // and split into other blocks, so the batch returned always fits, and is the largest when one more
  // sequence's activations outweigh such a step.
  in.rank_batch = 1;
  if (estimate_memory(in).total() > device_bytes) return 0;
  int lo = 1, hi = 2;
  for (;;) {
    in.rank_batch = hi;
    if (estimate_memory(in).total() > device_bytes) break;
    lo = hi;
    if (hi > (1 << 29)) return lo;
    hi *= 2;
  }
  while (hi - lo > 1) {
    in.rank_batch = lo + (hi - lo) / 2;
    (estimate_memory(in).total() > device_bytes ? hi : lo) = in.rank_batch;
  }
  return lo;
}

std::string MemorySavers::name() const {
  const bool blocks = recompute == Recompute::blocks;
  if (!offload_optimizer) return blocks ? "blocks" : "none";
  return blocks ? "blocks+offload" : "offload";
}

std::vector<int> largest_rank_batch_per_saver(EstimateInput in, Model& model, int64_t budget) {
  in.model = &model;
  std::vector<int> batches;
  for (const MemorySavers& savers : kAllMemorySavers) {
    try {
      model.set_recompute(savers.recompute);
    } catch (const UsageError&) {
      batches.push_back(-1);  // a model of its own without recomputation
      continue;
    }
    in.plan.placement.offload_optimizer = savers.offload_optimizer;
    batches.push_back(largest_rank_batch(in, budget));
  }
  model.set_recompute(Recompute::none);
  return batches;
}

std::string format_bytes(double bytes) {
  std::ostringstream os;
  os << std::fixed;
  if (bytes >= 1e9) os << std::setprecision(2) << bytes / 1e9 << " GB";
  else if (bytes >= 1e6) os << std::setprecision(2) << bytes / 1e6 << " MB";
  else os << std::setprecision(1) << bytes / 1e3 << " kB";
  return os.str();
}

}  // namespace zshard
