// zshard-mem: per-rank memory of a run before running it. For a model of the registry (--model, --config)
// or a bare parameter count (--params 7.5e9), world sizes, strategies and a dtype policy: bytes of params, grads,
// optimizer state, gathered units in flight, communication buffers and activations, and the largest
// batch that fits --device-mem. --max-batch tabulates that batch for every combination of activation
// checkpointing and optimizer offload. --check FILE compares the estimate with what zshard-bench measured.
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <numeric>

#include <nlohmann/json.hpp>

#include <zshard/model_registry.h>

#include "kernels/io/atomic_file.h"
#include "runtime/cli/memory_flags.h"
#include "runtime/cli/path_checks.h"
#include "runtime/cli/json_input.h"
#include "models/config_json.h"
#include "shard/frozen_params.h"
#include "shard/memory/estimator.h"
#include "runtime/tools/tool_runner.h"
#include "runtime/tools/tools.h"
#include "runtime/cli/flags.h"
#include "runtime/cli/model_options.h"
#include "runtime/cli/plan_flags.h"
#include "shard/plan_internals.h"

namespace zshard {
using nlohmann::json;

namespace {

// The plan of `kind` on `world` ranks: `base`'s placement, and the strategy options `kind` takes.
ShardPlan plan_of(const PlanOptions& base, StrategyKind kind, int world) {
  PlanOptions options = base;
  options.strategy = strategy_options_for(kind, base.strategy);
  return plan_for_world(options, world);
}

// The estimates of one strategy on `world` ranks: one row, or for hybrid over unequal groups one row per
// group (each group's ranks hold shards of their own size).
std::vector<EstimateInput> table_rows(const EstimateInput& base, const PlanOptions& plan, const std::string& strategy,
                                      int world) {
  EstimateInput in = base;
  in.plan = plan_of(plan, parse_strategy(strategy), world);
  if (in.plan.kind != StrategyKind::hybrid || in.plan.shard_group.sizes().size() < 2) return {in};
  std::vector<EstimateInput> rows;
  for (int g = 0; g < in.plan.groups.count(); ++g) {
    in.group = g;
    rows.push_back(in);
  }
  return rows;
}

struct MemOptions {
  std::string model;
  ModelConfig overrides;
  double params = 0;
  std::vector<int> worlds{1};
  std::vector<std::string> strategies{"ddp", "zero1", "zero2", "zero3"};
  ShardGroupRequest groups;  // hybrid's --shard-group
  StrategyOptions comm_modes;  // --quantize-gathers, --quantize-reductions, --secondary-shard
  std::string dtype = "fp32";
  DType reduce_dtype = DType::f32;  // --dtype mixed's gradient collectives, as zshard-train's --reduce-dtype
  int batch = 8;
  int seq = 64;
  int grad_accum = 1;
  int max_inflight = 2;
  Recompute recompute = Recompute::none;
  AttentionKernel attention = AttentionKernel::automatic;
  FusedEpilogues fused_epilogues = FusedEpilogues::automatic;
  std::vector<std::string> freeze;
  bool offload_optimizer = false;
  bool async_saves = false;
  bool imports_weights = false;
  Device device = Device::cpu;
  std::string device_mem;
  std::string mem_budget;
  bool max_batch = false;
  std::string json_path;
  std::string check;
};

json to_json(const MemoryEstimate& e) {
  return {{"shard_group", e.shard_group},
          {"params", e.params},
          {"frozen_params", e.frozen_params},
          {"param_bytes", e.model_states.params},
          {"frozen_bytes", e.model_states.frozen},
          {"grad_bytes", e.model_states.grads},
          {"optimizer_bytes", e.model_states.optimizer},
          {"host_bytes", e.model_states.host},
          {"model_states_bytes", e.model_states.total()},
          {"gathered_in_flight_bytes", e.gathered_in_flight},
          {"comm_buffer_bytes", e.comm_buffers},
          {"activation_bytes", e.activations},
          {"op_scratch_bytes", e.op_scratch},
          // Where the scratch falls (MemoryEstimate::op_scratch): what step_bytes takes the largest of.
          {"comm_before_reductions_bytes", e.comm_before_reductions},
          {"comm_at_last_unit_bytes", e.comm_at_last_unit},
          {"op_scratch_reducing_bytes", e.op_scratch_reducing},
          {"op_scratch_last_unit_bytes", e.op_scratch_last_unit},
          {"checkpoint_snapshot_bytes", e.checkpoint_snapshot},
          {"set_up_bytes", e.set_up},
          {"step_bytes", e.step_total()},
          {"total_bytes", e.total()}};
}

// Estimates each zshard-bench result in `doc` (read from `path`) and prints it beside the measurement. True
// when every model-state estimate is within 5% and every peak within 15%.
bool check_against(const json& doc, const std::string& path) {
  const json& m = doc.at("model");
  // Before any line of the table: a file that checks nothing, or a world no run had.
  const auto bad = [&](const auto&... what) { throw UsageError(detail::concat("--check ", path, ": ", what...)); };
  if (doc.at("results").empty()) bad("no results to check");
  for (const json& r : doc.at("results"))
    if (const int world = r.at("world").get<int>(); world < 1 || world > (1 << 20))
      bad("a result's world is ", world, ", not in [1, 1048576]");
  const std::string name = m.at("name").get<std::string>();
  if (const std::vector<std::string> known = model_names(); std::find(known.begin(), known.end(), name) == known.end())
    bad("benchmarked model '", name, "', which this binary does not have (a model of one's own: check with its ",
        "train_main binary's mem mode, `BINARY mem --check ", path, "`)");
  const std::unique_ptr<Model> model = build_model(name, model_config(name, m.at("config").get<ModelConfig>()));
  // Files written before the mode was recorded ran without checkpointing.
  const std::string mode = doc.value("activation_checkpointing", "none");
  if (mode != "none" && mode != "blocks")
    throw UsageError(detail::concat("--check ", path, ": activation_checkpointing must be none or blocks, got '",
                                    mode, "'"));
  model->set_recompute(mode == "blocks" ? Recompute::blocks
                                                       : Recompute::none);
  // Files written before the attention was recorded kept the probabilities.
  const std::string attention = doc.value("attention", "blocks");
  if (attention != "fused" && attention != "blocks")
    throw UsageError(detail::concat("--check ", path, ": attention must be fused or blocks, got '", attention, "'"));
  model->set_attention(attention == "fused" ? AttentionKernel::fused : AttentionKernel::blocks);
  // Files written before the fused ops were recorded ran them as auto chose.
  const std::string fused = doc.value("fused_epilogues", "auto");
  const auto fused_mode = std::find_if(std::begin(kFusedEpilogueModes), std::end(kFusedEpilogueModes),
                                       [&](FusedEpilogues m) { return fused_epilogues_flag(m) == fused; });
  if (fused_mode == std::end(kFusedEpilogueModes))
    throw UsageError(detail::concat("--check ", path, ": fused_epilogues must be auto, on or off, got '", fused, "'"));
  model->set_fused_epilogues(*fused_mode);
  // The memory modes the run was given; files written before they were recorded ran without them.
  StrategyOptions modes;
  modes.max_inflight = doc.at("max_inflight");
  modes.reshard_after_forward = doc.value("reshard_after_forward", true);
  modes.quantize_gathers = parse_gather_quantization(doc.value("quantize_gathers", "none"));
  modes.quantize_reductions = parse_reduction_quantization(doc.value("quantize_reductions", "none"));
  const std::vector<std::string> freeze = doc.value("freeze", std::vector<std::string>{});
  std::cout << "estimate vs zshard-bench (" << path << "): " << m.at("name").get<std::string>() << ", world "
            << doc.at("world") << ", rank batch " << doc.at("rank_batch_max") << "x" << doc.at("seq")
            << (mode == "blocks" ? ", activation checkpointing" : "") << ", attention " << attention << "\n"
            << std::left << std::setw(9) << "strategy" << std::right << std::setw(14) << "states est"
            << std::setw(14) << "measured" << std::setw(8) << "ratio" << std::setw(14) << "peak est" << std::setw(14)
            << "measured" << std::setw(8) << "ratio" << "\n";
  bool ok = true;
  for (const json& r : doc.at("results")) {
    EstimateInput e;
    e.model = model.get();
    e.freeze = freeze;
    const StrategyKind kind = parse_strategy(r.at("strategy").get<std::string>());
    PlanOptions plan;
    plan.strategy = strategy_options_for(kind, modes);
    // Every group's size (files written before they were recorded: groups of shard_group). With unequal
    // groups the model states are rank 0's group's, the peak the largest over the ranks.
    const std::vector<int> sizes = r.value("shard_group_sizes", std::vector<int>{});
    if (kind == StrategyKind::hybrid)
      plan.strategy.shard_group = sizes.size() > 1 ? ShardGroupRequest::list(sizes)
                                                   : ShardGroupRequest::equal(r.at("shard_group").get<int>());
    plan.placement.offload_optimizer = doc.value("offload", "none") == "optimizer";
    // The run's parameter dtype ("fp32" or "bf16") and device; files written before they were recorded ran
    // fp32 on the cpu.
    const std::string param_dtype = r.at("memory_report").value("param_dtype", "fp32");
    plan.placement.device = r.at("memory_report").value("device", "cpu") == "cuda" ? Device::cuda : Device::cpu;
    plan.placement.param_dtype = param_dtype == "bf16" ? DType::bf16 : DType::f32;
    plan.placement.reduce_dtype = r.at("memory_report").value("reduce_dtype", "fp32") == "bf16" ? DType::bf16 : DType::f32;
    e.plan = plan_for_world(plan, r.at("world").get<int>());
    // The secondary groups the run's hosts made (--secondary-shard host has none here).
    const std::vector<int> secondary = r.at("memory_report").value("secondary_group_sizes", std::vector<int>{});
    if (!secondary.empty()) e.plan.secondary_groups = ShardGroups(secondary);
    // A result's own (--rank-batches auto moves it); files written before it was recorded have the run's.
    e.rank_batch = r.value("rank_batch_max", doc.at("rank_batch_max").get<int>());
    e.seq = doc.at("seq");
    e.grad_accum = doc.at("grad_accum");
    MemoryEstimate est = estimate_memory(e);
    // Unequal groups under a split that stays (not auto): each group's ranks with their own largest batch,
    // since the smallest group's may hold fewer sequences than the largest micro-batch.
    const std::vector<int> split = r.value("split", std::vector<int>{});
    const ShardGroups& groups = e.plan.groups;
    if (r.value("rank_batches", "") != "auto" && groups.count() > 1 && int(split.size()) == groups.world_size()) {
      int64_t peak = 0;
      for (int g = 0; g < groups.count(); ++g) {
        EstimateInput in = e;
        in.group = g;
        in.rank_batch = 0;
        for (int rank = 0; rank < groups.world_size(); ++rank)
          if (groups.group_of(rank) == g) in.rank_batch = std::max(in.rank_batch, split[size_t(rank)]);
        const MemoryEstimate group_est = estimate_memory(in);
        if (group_est.step_total() > peak) {
          peak = group_est.step_total();
          est = group_est;
        }
      }
    }
    e.group = 0;
    const int64_t est_states = estimate_memory(e).model_states.total();
    const double states = r.at("model_states_bytes").at("measured"), peak = r.at("peak_total_bytes");
    // zshard-bench's peaks start after set-up: the step's estimate is what it measured.
    const double rs = double(est_states) / states, rp = double(est.step_total()) / peak;
    const bool good = std::abs(rs - 1) <= 0.05 && std::abs(rp - 1) <= 0.15;
    ok = ok && good;
    std::cout << std::left << std::setw(9) << r.at("strategy").get<std::string>() << std::right << std::setw(14)
              << format_bytes(double(est_states)) << std::setw(14) << format_bytes(states) << std::setw(8)
              << std::fixed << std::setprecision(3) << rs << std::setw(14) << format_bytes(double(est.step_total()))
              << std::setw(14) << format_bytes(peak) << std::setw(8) << rp << (good ? "  ok" : "  OUTSIDE 5%/15%")
              << "\n";
  }
  return ok;
}

// --max-batch: one row per strategy and world, the largest per-rank micro-batch for each memory saver.
json print_max_batch_table(const MemOptions& o, EstimateInput base, const PlanOptions& plan, Model& model,
                           int64_t budget) {
  std::cout << "zshard-mem --max-batch: " << o.model << ", dtype " << o.dtype << ", seq " << o.seq << ", budget "
            << format_bytes(double(budget)) << " per rank: the most sequences per rank and micro-step\n"
            << std::left << std::setw(8) << "strategy" << std::right << std::setw(8) << "N" << std::setw(8) << "G";
  for (const MemorySavers& savers : kAllMemorySavers) std::cout << std::setw(16) << savers.name();
  std::cout << "\n";
  json rows = json::array();
  for (const std::string& s : o.strategies) {
    for (int world : o.worlds)
      for (const EstimateInput& in : table_rows(base, plan, s, world)) {
        const std::vector<int> batches = largest_rank_batch_per_saver(in, model, budget);
        const int G = estimate_memory(in).shard_group;
        json row = {{"strategy", s}, {"world", world}, {"shard_group", G}, {"max_rank_batch", json::object()}};
        std::cout << std::left << std::setw(8) << s << std::right << std::setw(8) << world << std::setw(8) << G;
        for (size_t i = 0; i < batches.size(); ++i) {
          const bool unsupported = batches[i] < 0;  // the model cannot recompute its blocks
          row["max_rank_batch"][kAllMemorySavers[i].name()] = unsupported ? json(nullptr) : json(batches[i]);
          std::cout << std::setw(16) << (unsupported ? std::string("-") : std::to_string(batches[i]));
        }
        std::cout << "\n";
        rows.push_back(row);
      }
  }
  return json{{"tool", "zshard-mem"}, {"model", o.model},          {"dtype", o.dtype},
              {"seq", o.seq},         {"budget_bytes", budget},    {"max_batch", rows}};
}

bool check_against(const std::string& path) {
  const json doc = read_json_file("--check", path);
  return read_fields("--check", path, [&] { return check_against(doc, path); });
}

}  // namespace

int mem_tool(int argc, char** argv, const std::string& default_model) {
  MemOptions o;
  o.model = default_model;
  CLI::App app{"zshard-mem: per-rank memory estimate for a model, world size, strategy and dtype policy"};
  app.option_defaults()->always_capture_default();
  add_model_flags(app, o.model, o.overrides);
  add_freeze_flag(app, o.freeze);
  app.add_option("--params", o.params, "bare parameter count, e.g. 7.5e9 (model states only)")
      ->excludes(app.get_option("--model"));
  add_list_option(app, "--world", o.worlds, "world sizes, comma separated", Repeats::refused);
  add_list_option(app, "--strategy", o.strategies, "strategies, comma separated", strategy_names());
  add_shard_group_flag(app, o.groups);
  app.add_option("--dtype", o.dtype, "fp32 (zshard's CPU path) or mixed (2-byte params/grads, K=12)");
  app.add_option("--batch", o.batch, "global sequences per micro-step, split across the world");
  app.add_option("--seq", o.seq, "tokens per sequence");
  app.add_option("--grad-accum", o.grad_accum,
                 "micro-steps per optimizer step, as zshard-train's: the accumulation scratch joins comm");
  app.add_option("--max-inflight", o.max_inflight, "zero3/hybrid: gathered units alive at once");
  add_comm_mode_flags(app, o.comm_modes);
  add_reshard_flag(app, o.comm_modes.reshard_after_forward);
  add_reduce_dtype_flag(app, o.reduce_dtype);
  add_recompute_flag(app, o.recompute);
  add_attention_flag(app, o.attention);
  add_fused_epilogues_flag(app, o.fused_epilogues);
  add_offload_flag(app, o.offload_optimizer);
  app.add_flag("--async-saves", o.async_saves,
               "count the host snapshot of periodic asynchronous saves (zshard-train --save-every with the "
               "default --save-mode async), held by the first shard group's ranks: in the total on the cpu")
      ->excludes(app.get_option("--params"));
  app.add_flag("--imports-weights", o.imports_weights,
               "count set-up's import of a weights file (zshard-train --init-from): each unit's buffers read whole "
               "in fp32, one at a time, beside every model state");
  add_device_flag(app, o.device,
                  "where the run would compute: cpu, or cuda (the offloaded optimizer's host bytes, with a host copy "
                  "of the owned gradients, are then host memory beside the device's total)");
  app.add_option("--device-mem", o.device_mem, "device memory, e.g. 80GiB: also print the largest batch that fits");
  app.add_option("--mem-budget", o.mem_budget,
                 "memory each rank may use, e.g. 2GiB (what zshard-train --batch auto fits to): like --device-mem, "
                 "for a budget below the device's")
      ->excludes(app.get_option("--device-mem"));
  app.add_flag("--max-batch", o.max_batch,
               "with --device-mem or --mem-budget (per rank): the largest sequences per rank for each of "
               "--activation-checkpointing none|blocks x --offload none|optimizer (offload's host bytes count "
               "against the budget on the cpu, where the host is the device)");
  app.add_option("--json", o.json_path, "write the estimates as JSON to this file");
  CLI::Option* check = app.add_option("--check", o.check, "zshard-bench JSON: compare the estimate with its measurements");
  // Flags that would be silently ignored: a bare count has no configuration and no activations, and --check
  // takes everything from its file.
  for (const char* model_only : {"--config", "--layers", "--dim", "--heads", "--vocab", "--ctx", "--kv-heads",
                                 "--ffn-dim", "--rope-theta", "--tie-embeddings", "--activation-checkpointing",
                                 "--attention", "--fused-epilogues", "--lora-rank", "--lora-alpha", "--lora-targets", "--freeze",
                                 "--reduce-dtype", "--reshard-after-forward", "--imports-weights"})
    app.get_option("--params")->excludes(app.get_option(model_only));
  for (CLI::Option* opt : app.get_options())
    if (opt != check && opt != app.get_help_ptr() && opt->get_name() != "--json") check->excludes(opt);
  return run_local_tool("zshard-mem", argc, argv, app, [&] {
    if (!o.json_path.empty()) {
      check_output_path("--json", o.json_path);
      check_not_input({"--json", o.json_path}, {{"--check", o.check}});
      if (!o.check.empty()) throw UsageError("--json: --check prints its comparison and writes no JSON");
    }
    if (!o.check.empty()) return check_against(o.check) ? 0 : 1;
    if (app.count("--params") && !(o.params > 0 && o.params <= 1e15))
      throw UsageError(detail::concat("--params must be in (0, 1e15], got ", o.params));
    if (o.model.empty() && !(o.params > 0)) throw UsageError("give --model NAME or --params COUNT");
    for (int world : o.worlds)
      if (world < 1 || world > (1 << 20))
        throw UsageError(detail::concat("--world entries must be in [1, 1048576], got ", world));
    if (o.groups.kind() == ShardGroupRequest::Kind::node)
      throw UsageError("--shard-group node: zshard-mem runs on no hosts; give the nodes' sizes, e.g. 4,2");
    // Unequal groups fix the world: theirs, unless --world names it (and then must match).
    const std::vector<int>& sizes = o.groups.sizes();
    if (sizes.size() > 1) check_group_sizes(sizes, "--shard-group");
    if (sizes.size() > 1 && !app.count("--world")) o.worlds = {std::accumulate(sizes.begin(), sizes.end(), 0)};
    for (const std::string& s : o.strategies) {
      StrategyOptions groups{parse_strategy(s), o.groups};
      if (groups.kind == StrategyKind::hybrid)
        for (int world : o.worlds) shard_groups(groups, world);  // groups that do not fit, before any output
    }
    const auto has = [&](const char* s) { return std::find(o.strategies.begin(), o.strategies.end(), s) != o.strategies.end(); };
    if (app.count("--shard-group") && !has("hybrid")) throw UsageError("--shard-group is only for --strategy hybrid");
    if (app.count("--max-inflight") && !has("zero3") && !has("hybrid"))
      throw UsageError("--max-inflight is only for --strategy zero3 or hybrid");
    if (app.count("--reshard-after-forward") && !has("zero3") && !has("hybrid"))
      throw UsageError("--reshard-after-forward is only for --strategy zero3 or hybrid");
    std::vector<StrategyKind> kinds;
    for (const std::string& s : o.strategies) kinds.push_back(parse_strategy(s));
    check_modes_taken(kinds, o.comm_modes);
    if (o.batch < 1) throw UsageError("--batch must be >= 1, got " + std::to_string(o.batch));
    if (o.seq < 1) throw UsageError("--seq must be >= 1, got " + std::to_string(o.seq));
    if (o.grad_accum < 1) throw UsageError("--grad-accum must be >= 1, got " + std::to_string(o.grad_accum));
    if (o.params <= 0 && !o.max_batch)  // as zshard-train refuses it: a rank without a sequence
      for (int world : o.worlds)
        if (o.batch < world)
          throw UsageError(detail::concat("--batch ", o.batch, " is smaller than the world size ", world));
    if (o.max_inflight < 1) throw UsageError("--max-inflight must be >= 1");
    PlanOptions plan;
    plan.strategy = o.comm_modes;
    plan.strategy.shard_group = o.groups;
    plan.strategy.max_inflight = o.max_inflight;
    plan.placement = {o.device, parse_dtype_policy(o.dtype), o.reduce_dtype, o.offload_optimizer};
    EstimateInput base;
    base.seq = o.seq;
    base.grad_accum = o.grad_accum;
    base.checkpoint_snapshot = o.async_saves;
    base.imports_weights = o.imports_weights;
    base.freeze = o.freeze;
    std::unique_ptr<Model> model;
    if (o.params > 0) {
      base.params = int64_t(std::llround(o.params));
    } else {
      model = build_model(o.model, model_config(o.model, o.overrides));
      model->set_recompute(o.recompute);
      model->set_fused_epilogues(o.fused_epilogues);
      choose_attention(*model, o.attention, plan.placement.device, plan.placement.param_dtype);
      if (o.seq > model->context_length())
        throw UsageError(detail::concat("--seq ", o.seq, " exceeds the model's context of ", model->context_length()));
      base.model = model.get();
    }
    const int64_t device = !o.mem_budget.empty()  ? parse_bytes(o.mem_budget, "--mem-budget")
                           : !o.device_mem.empty() ? parse_bytes(o.device_mem, "--device-mem")
                                                   : 0;
    if (o.max_batch) {
      if (!model)
        throw UsageError("--max-batch needs a model (--model or --config), not --params: a bare count has no "
                         "activations to size");
      if (!device) throw UsageError("--max-batch needs --mem-budget SIZE (per rank) or --device-mem SIZE");
      const json doc = print_max_batch_table(o, base, plan, *model, device);
      if (!o.json_path.empty()) write_file_atomically(o.json_path, doc.dump(2) + "\n");
      return 0;
    }

    // Every row estimated first: a plan that cannot be made (secondary groups the world cannot hold, say) is
    // refused before any line of the table.
    struct Row {
      std::string strategy;
      int world;
      EstimateInput in;
      MemoryEstimate estimate;
    };
    std::vector<Row> table;
    for (const std::string& s : o.strategies)
      for (int world : o.worlds)
        for (EstimateInput in : table_rows(base, plan, s, world)) {
          in.rank_batch = (o.batch + world - 1) / world;
          table.push_back({s, world, in, estimate_memory(in)});
        }
    json rows = json::array();
    // Frozen parameters (--freeze, LoRA's base) get a column of their own: a compute copy, nothing else.
    const bool frozen = base.model && count_params(*base.model, o.freeze).frozen > 0;
    // The ops' scratch gets a column where the model counts any (Model::workspace_bytes): the cpu's bf16
    // ops copy their arrays to fp32, blocks attention keeps its score gradients, adapters theirs.
    const bool scratch = std::any_of(table.begin(), table.end(), [](const Row& r) { return r.estimate.op_scratch > 0; });
    std::cout << "zshard-mem: " << (o.model.empty() ? "" : o.model + ", ") << "dtype " << o.dtype
              << (base.model ? ", global batch " + std::to_string(o.batch) + "x" + std::to_string(o.seq) : "")
              << " (per rank; GB = 1e9 bytes" << (o.device == Device::cpu ? "" : "; total: the GPU's, host apart")
              << ")\n"
              << std::left << std::setw(8) << "strategy" << std::right << std::setw(8) << "N" << std::setw(8) << "G"
              << std::setw(12) << "params" << std::setw(frozen ? 12 : 0) << (frozen ? "frozen" : "") << std::setw(12)
              << "grads" << std::setw(12) << "optimizer"
              << std::setw(12) << "host" << std::setw(12) << "states" << std::setw(12) << "in flight"
              << std::setw(12) << "comm" << std::setw(12) << "activations" << std::setw(scratch ? 12 : 0)
              << (scratch ? "scratch" : "") << std::setw(o.async_saves ? 12 : 0)
              << (o.async_saves ? "snapshot" : "") << std::setw(base.model ? 12 : 0) << (base.model ? "set-up" : "")
              << std::setw(12) << "total"
              << (device ? "  max batch/rank" : "") << "\n";
    for (const auto& [s, world, in, e] : table) {
      json row = to_json(e);
      row["strategy"] = s;
      row["world"] = world;
      // Wide enough for 2^20 ranks, the most a world may have, with a space between.
      std::cout << std::left << std::setw(8) << s << std::right << std::setw(8) << world << std::setw(8)
                << e.shard_group;
      std::vector<int64_t> columns = {e.model_states.params};
      if (frozen) columns.push_back(e.model_states.frozen);
      columns.insert(columns.end(), {e.model_states.grads, e.model_states.optimizer, e.model_states.host,
                                     e.model_states.total(), e.gathered_in_flight, e.comm_buffers, e.activations});
      if (scratch) columns.push_back(e.op_scratch);
      if (o.async_saves) columns.push_back(e.checkpoint_snapshot);
      if (base.model) columns.push_back(e.set_up);
      columns.push_back(e.total());
      for (int64_t v : columns)
        std::cout << std::setw(12) << (base.model || v ? format_bytes(double(v)) : std::string("-"));
      if (device) {
        const int fit = largest_rank_batch(in, device);
        row["max_rank_batch"] = fit;
        std::cout << std::setw(16) << (fit < 0 ? std::string("- (no model)") : std::to_string(fit));
      }
      std::cout << "\n";
      rows.push_back(row);
    }
    if (!o.json_path.empty())
      write_file_atomically(o.json_path,
                            json{{"tool", "zshard-mem"}, {"model", o.model}, {"dtype", o.dtype},
                                 {"device", device_name(o.device)}, {"rows", rows}}.dump(2) + "\n");
    return 0;
  });
}

}  // namespace zshard
