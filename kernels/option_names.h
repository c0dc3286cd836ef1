// How an error names the setting it refuses. The core library's checks name the option of its API that a
// program set (StrategyOptions::max_inflight); zshard's tools, which set those options from flags, switch
// to the flags' names (--max-inflight) once at start, so that a bad flag's message names the flag the
// user typed. One check, either name: the tools never repeat a check of the core to reword it.
#pragma once
#include <string>
#include <string_view>

namespace zshard {

enum class Option {
  strategy,
  shard_group,
  max_inflight,
  reshard_after_forward,
  quantize_gathers,
  quantize_reductions,
  secondary_shard,
  device,
  param_dtype,
  reduce_dtype,
  offload,
  comm,
  comm_timeout,
  model,
  config,
  recompute,
  attention,
  trace_dir,
  batch,
  grad_accum,
  save_mode,
  mem_check,
  freeze,
  lora_rank,
  lora_alpha,
  lora_targets,
  cuda_graphs,
  rank_batches,
};

// The option's name under the naming in force: "StrategyOptions::max_inflight" or "--max-inflight".
std::string_view option_name(Option option);
// The option set to a value, as the naming in force writes it: option_setting(Option::offload, "none",
// "false") is "--offload none" or "Placement::offload_optimizer = false".
std::string option_setting(Option option, std::string_view flag_value, std::string_view api_value);

// The naming in force: api by default; zshard's tools set flags once, first thing in main.
enum class OptionNaming { api, flags };
void set_option_naming(OptionNaming naming);
OptionNaming option_naming();

}  // namespace zshard
