#include "runtime/cli/plan_flags.h"

#include <vector>

#include <zshard/error.h>

#include "runtime/cli/flags.h"
#include "shard/plan_internals.h"

namespace zshard {

void add_shard_group_flag(CLI::App& app, ShardGroupRequest& request) {
  add_list_option(
         app, "--shard-group",
         [&request](const std::vector<std::string>& items) {
           if (items.size() == 1 && items[0] == "node") {
             request = ShardGroupRequest::node();
             return;
           }
           std::vector<int> sizes;
           for (const std::string& item : items) {
             const std::optional<int> g = whole_int(item);
             const bool list = items.size() > 1;
             if (!g || *g < (list ? 1 : 0))
               throw CLI::ValidationError("--shard-group", std::string("must be node, a group size >= 0 or a list of "
                                                                       "sizes >= 1, got '") + item + "'");
             sizes.push_back(*g);
           }
           // 0: the default, as if not given.
           if (sizes.size() == 1) request = sizes[0] == 0 ? ShardGroupRequest() : ShardGroupRequest::equal(sizes[0]);
           else request = ShardGroupRequest::list(sizes);
         },
         "hybrid: ranks per shard group dividing the world; a list of group sizes in rank order, e.g. 4,2 for a "
         "node of 4 beside a node of 2; or node: each host's ranks (0 = node across two or more hosts, else the "
         "largest divisor up to 8 leaving two replicas)")
      ->type_name("G|G1,G2,..|node")
      ->default_str("0");
}

void add_device_flag(CLI::App& app, Device& device, const std::string& help) {
  add_choice<Device>(app, "--device", device, {{"cpu", Device::cpu}, {"cuda", Device::cuda}}, help);
}

void add_offload_flag(CLI::App& app, bool& offload_optimizer) {
  add_choice<bool>(app, "--offload", offload_optimizer, {{"none", false}, {"optimizer", true}},
                   "optimizer: keep the fp32 master and Adam state in host memory and step there (ZeRO-Offload)");
}

namespace {

// A flag whose value the core parses: its UsageError, which names the flag and the valid values, is the
// flag's message; --help shows the value's name.
template <class E, class Parse, class Name>
void add_parsed_flag(CLI::App& app, const std::string& flag, E& value, Parse parse, Name name, const std::string& help) {
  app.add_option_function<std::string>(
         flag,
         [&value, parse](const std::string& text) {
           try {
             value = parse(text);
           } catch (const UsageError& e) {
             throw CLI::ValidationError(e.what());
           }
         },
         help)
      ->default_str(std::string(name(value)));
}

Choices<DType> float_dtypes() {
  return {{std::string(dtype_flag(DType::f32)), DType::f32}, {std::string(dtype_flag(DType::bf16)), DType::bf16}};
}

}  // namespace

void add_comm_mode_flags(CLI::App& app, StrategyOptions& s) {
  add_parsed_flag(app, "--quantize-gathers", s.quantize_gathers, parse_gather_quantization,
                  gather_quantization_name,
                  "zero3/hybrid: none, or int8: parameters gathered as int8 with an fp32 scale per block of at "
                  "most 256 elements of one parameter (ZeRO++ qwZ)");
  add_parsed_flag(app, "--quantize-reductions", s.quantize_reductions, parse_reduction_quantization,
                  reduction_quantization_name,
                  "zero1/zero2/zero3/hybrid: none, int8 or int4: gradients reduced in the shard group as blocks of "
                  "at most 256 (int8) or 64 (int4) elements of one parameter with an fp32 scale, summed in fp32 by "
                  "their owner (ZeRO++ qgZ)");
  add_parsed_flag(app, "--secondary-shard", s.secondary_shard, parse_secondary_shard, secondary_shard_text,
                  "zero3: none; host: after a unit's forward keep each host's share of it, so that backward gathers "
                  "inside the host (ZeRO++ hpZ); or N: the same in groups of N consecutive ranks");
}

void add_reshard_flag(CLI::App& app, bool& reshard_after_forward) {
  app.add_option("--reshard-after-forward", reshard_after_forward,
                 "zero3/hybrid: free gathered params after each unit's forward (true/false)");
}

void add_reduce_dtype_flag(CLI::App& app, DType& reduce_dtype) {
  add_choice(app, "--reduce-dtype", reduce_dtype, float_dtypes(),
             "dtype of the gradient collectives: fp32, or bf16 (half the traffic); bf16 gradients reduced in fp32 "
             "are converted into a buffer of their unit's size first");
}

const std::vector<std::string>& strategy_names() {
  static const std::vector<std::string> names = {"ddp", "zero1", "zero2", "zero3", "hybrid"};
  return names;
}

void add_plan_flags(CLI::App& app, PlanOptions& o) {
  app.add_option_function<std::string>(
         "--strategy",
         [&o](const std::string& name) {
           try {
             o.strategy.kind = parse_strategy(name);
           } catch (const UsageError&) {
             throw CLI::ValidationError("--strategy", "unknown strategy '" + name +
                                                          "' (valid: ddp, zero1, zero2, zero3, hybrid)");
           }
         },
         "ddp, zero1, zero2, zero3 or hybrid")
      ->default_str(std::string(strategy_name(o.strategy.kind)));
  add_shard_group_flag(app, o.strategy.shard_group);
  add_reshard_flag(app, o.strategy.reshard_after_forward);
  app.add_option("--max-inflight", o.strategy.max_inflight, "zero3/hybrid: gathered units alive at once");
  add_comm_mode_flags(app, o.strategy);
  add_device_flag(app, o.placement.device,
                  "where to compute: cpu, or cuda (a GPU per rank: local rank modulo the visible GPUs)");
  add_choice(app, "--param-dtype", o.placement.param_dtype, float_dtypes(),
             "parameters and gradients: fp32, or bf16 with an fp32 master copy and Adam state");
  add_reduce_dtype_flag(app, o.placement.reduce_dtype);
  add_choice<CommBackend>(app, "--comm", o.comm, {{"mpi", CommBackend::mpi}, {"nccl", CommBackend::nccl}},
                          "collectives: mpi, or nccl (cuda) [default: nccl on cuda, mpi on cpu]");
  add_offload_flag(app, o.placement.offload_optimizer);
  app.add_option("--comm-timeout", o.comm_timeout_s,
                 "seconds any collective may take, set-up's included, before the job aborts");
}

}  // namespace zshard
