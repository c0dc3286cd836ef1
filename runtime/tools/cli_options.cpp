#include "runtime/tools/cli_options.h"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "runtime/train/auto_batch.h"

namespace zshard {

namespace {

template <class E>
using Choices = std::vector<std::pair<std::string, E>>;

// The integer `text` spells whole (nothing after it, no overflow), or nothing: for the flags
// that take a number or a word (--batch N|auto, --rank-batches ...|auto, --shard-group G|node).
std::optional<int> whole_int(const std::string& text) {
  size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size()) return std::nullopt;
  return value;
}

// A flag taking one of `choices` by name into `value` (an E, or an optional one); --help lists the names
// and shows the current value's as the default.
template <class E, class V>
void add_choice(CLI::App& app, const std::string& flag, V& value, const Choices<E>& choices,
                const std::string& help) {
  std::vector<std::string> names;
  std::string current;
  for (const auto& [name, choice] : choices) {
    names.push_back(name);
    if (value == choice) current = name;
  }
  app.add_option_function<std::string>(
         flag,
         [&value, choices](const std::string& given) {
           for (const auto& [name, choice] : choices)
             if (name == given) value = choice;
         },
         help)
      ->check(CLI::IsMember(names))
      ->default_str(current);
}

std::string join(const std::vector<std::string>& items) {
  std::string text;
  for (const std::string& item : items) text += (text.empty() ? "" : ",") + item;
  return text;
}

}  // namespace

CLI::Option* add_list_option(CLI::App& app, const std::string& flag,
                             std::function<void(const std::vector<std::string>&)> take, const std::string& help) {
  return app.add_option_function<std::vector<std::string>>(
      flag,
      [flag, take](const std::vector<std::string>& args) {
        std::vector<std::string> items;
        for (const std::string& arg : args)
          for (size_t begin = 0;;) {
            const size_t comma = arg.find(',', begin);
            items.push_back(arg.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin));
            if (items.back().empty()) throw CLI::ValidationError(flag, "empty item in the list '" + arg + "'");
            if (comma == std::string::npos) break;
            begin = comma + 1;
          }
        take(items);
      },
      help);
}

CLI::Option* add_list_option(CLI::App& app, const std::string& flag, std::vector<std::string>& items,
                             const std::string& help, const std::vector<std::string>& allowed) {
  return add_list_option(
             app, flag,
             [&items, flag, allowed](const std::vector<std::string>& given) {
               for (const std::string& item : given)
                 if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), item) == allowed.end())
                   throw CLI::ValidationError(flag, "'" + item + "' is not one of " + join(allowed));
               items = given;
             },
             help)
      ->default_str(join(items));
}

CLI::Option* add_list_option(CLI::App& app, const std::string& flag, std::vector<int>& values, const std::string& help) {
  std::vector<std::string> defaults;
  for (int v : values) defaults.push_back(std::to_string(v));
  return add_list_option(
             app, flag,
             [&values, flag](const std::vector<std::string>& given) {
               values.clear();
               for (const std::string& item : given) {
                 const std::optional<int> n = whole_int(item);
                 if (!n) throw CLI::ValidationError(flag, "expected integers, got '" + item + "'");
                 values.push_back(*n);
               }
             },
             help)
      ->default_str(join(defaults));
}

void add_model_flags(CLI::App& app, std::string& model, ModelConfig& overrides) {
  std::string known;
  for (const std::string& name : model_names()) known += (known.empty() ? "" : ", ") + name;
  app.add_option("--model", model, "model: " + known);
  add_list_option(
         app, "--config",
         [&overrides](const std::vector<std::string>& items) {
           for (const std::string& item : items) {
             const size_t eq = item.find('=');
             int64_t value = 0;
             size_t used = 0;
             try {
               if (eq != std::string::npos) value = std::stoll(item.substr(eq + 1), &used);
             } catch (const std::exception&) {
               used = 0;
             }
             if (eq == 0 || eq == std::string::npos || used == 0 || used != item.size() - eq - 1)
               throw CLI::ValidationError("--config", "expected KEY=INTEGER, got '" + item + "'");
             overrides[item.substr(0, eq)] = value;
           }
         },
         "override the model's configuration: KEY=VALUE, comma separated (e.g. layers=4,dim=128)");
  // Shorthands for --config of the keys the transformer families share (a model without the key refuses it).
  for (const auto& [flag, key] : {std::pair{"--layers", "layers"}, std::pair{"--dim", "dim"},
                                  std::pair{"--heads", "heads"}, std::pair{"--vocab", "vocab"},
                                  std::pair{"--ctx", "ctx"}, std::pair{"--kv-heads", "kv_heads"},
                                  std::pair{"--ffn-dim", "ffn_dim"}, std::pair{"--rope-theta", "rope_theta"}})
    app.add_option_function<int64_t>(
        flag, [&overrides, key](int64_t value) { overrides[key] = value; },
        std::string("the model's ") + key + " (--config " + key + "=VALUE)");
  app.add_option_function<bool>(
      "--tie-embeddings", [&overrides](bool tied) { overrides["tie_embeddings"] = tied; },
      "the output head reuses the token embedding: true or false (--config tie_embeddings=1|0)");
}

void add_checkpointing_flag(CLI::App& app, ActivationCheckpointing& mode) {
  Choices<ActivationCheckpointing> modes;
  for (ActivationCheckpointing m : {ActivationCheckpointing::none, ActivationCheckpointing::blocks})
    modes.emplace_back(std::string(checkpointing_flag(m)), m);
  add_choice(app, "--activation-checkpointing", mode, modes,
             "none, or blocks: keep each block's input only and recompute the block inside its backward "
             "(less activation memory, one more block forward per step, the same results)");
}

void add_offload_flag(CLI::App& app, bool& offload_optimizer) {
  add_choice<bool>(app, "--offload", offload_optimizer, {{"none", false}, {"optimizer", true}},
                   "optimizer: keep the fp32 master and Adam state in host memory and step there (ZeRO-Offload)");
}

void add_shard_group_flag(CLI::App& app, StrategyOptions& strategy) {
  add_list_option(
         app, "--shard-group",
         [&strategy](const std::vector<std::string>& items) {
           strategy.shard_group = 0;
           strategy.shard_group_sizes.clear();
           if (items.size() == 1 && items[0] == "node") {
             strategy.shard_group = kShardGroupNode;
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
           if (sizes.size() == 1) strategy.shard_group = sizes[0];
           else strategy.shard_group_sizes = sizes;
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

void add_train_flags(CLI::App& app, TrainOptions& o, std::string& strategy) {
  app.option_defaults()->always_capture_default();
  add_model_flags(app, o.model, o.overrides);
  app.add_option("--init-from", o.init_from, "initial weights (safetensors with the model's parameter names)");
  app.add_option("--data", o.data, "'default' (embedded text), a text file (bytes) or an llm.c .bin token file");
  const std::string auto_cap = detail::concat("at most ", default_auto_batch_tokens(Device::cpu),
                                              " tokens per rank and micro-step on cpu, ",
                                              default_auto_batch_tokens(Device::cuda), " on cuda");
  // A number, or auto: the largest that fits --mem-budget (zshard-train only).
  app.add_option_function<std::string>(
         "--batch",
         [&o](const std::string& given) {
           o.auto_batch = given == "auto";
           if (o.auto_batch) return;
           const std::optional<int> n = whole_int(given);
           if (!n) throw CLI::ValidationError("--batch", "expected a number of sequences or auto, got '" + given + "'");
           o.batch = *n;
         },
         "global sequences per micro-step, split across ranks; or auto: the largest that fits --mem-budget "
         "(zshard-train: by the estimate, then stepped down until the measured peak of its first steps fits; "
         "without --mem-budget, " + auto_cap + ")")
      ->type_name("N|auto")
      ->default_str(std::to_string(o.batch));
  app.add_option("--mem-budget", o.mem_budget,
                 "with --batch auto: the memory each rank may use, e.g. 2GiB (the host's bytes count too with "
                 "--offload optimizer; default: what the set-up memory check finds usable per rank, taking " + auto_cap + ")");
  app.add_option("--seq", o.seq, "tokens per sequence");
  app.add_option("--grad-accum", o.grad_accum, "micro-steps per optimizer step");
  add_list_option(
         app, "--rank-batches",
         [&o](const std::vector<std::string>& items) {
           o.rank_batches.clear();
           o.rank_batches_auto = false;
           for (const std::string& item : items) {
             if (item == "auto") {
               o.rank_batches_auto = true;
               continue;
             }
             const std::optional<int> n = whole_int(item);
             if (!n) throw CLI::ValidationError("--rank-batches", "expected integers or 'auto', got '" + item + "'");
             o.rank_batches.push_back(*n);
           }
         },
         "per-rank sequences, comma separated, summing to --batch; or 'auto': split by each rank's measured "
         "speed");
  app.add_option_function<int>(
      "--rebalance-every", [&o](int n) { o.rebalance_every = n; },
      "--rank-batches auto: re-split the batch every N steps (0 = never) [default: 5]");
  app.add_option_function<int>(
      "--max-rank-batch", [&o](int n) { o.max_rank_batch = n; },
      "--rank-batches auto: the most sequences a rank may take [default: what its memory allows]");
  app.add_option("--steps", o.steps, "optimizer steps");
  app.add_option("--lr", o.lr, "peak learning rate");
  app.add_option("--warmup", o.warmup, "linear warmup steps");
  app.add_option("--lr-schedule", o.lr_schedule, "constant or cosine (decays to --min-lr)");
  app.add_option("--min-lr", o.min_lr, "final learning rate of the cosine schedule");
  app.add_option("--wd", o.wd, "AdamW weight decay (matrices and embeddings only)");
  app.add_option("--beta1", o.beta1, "AdamW beta1");
  app.add_option("--beta2", o.beta2, "AdamW beta2");
  app.add_option("--eps", o.eps, "AdamW epsilon");
  app.add_option("--grad-clip", o.grad_clip, "global gradient-norm clip (0 disables)");
  // An unsigned flag would take -1 as 2^64-1, and anything past 2^64-1 as 2^64-1.
  app.add_option("--seed", o.seed, "initialisation seed")
      ->check(CLI::Validator(
          [](const std::string& v) {
            if (v.rfind('-', 0) == 0) return "must be >= 0, got " + v;
            try {
              std::stoull(v);
            } catch (const std::out_of_range&) {
              return "must be below 2^64, got " + v;
            } catch (const std::exception&) {
            }
            return std::string();
          },
          "UINT"));
  app.add_option("--strategy", strategy, "ddp, zero1, zero2, zero3 or hybrid");
  add_shard_group_flag(app, o.strategy);
  app.add_option("--reshard-after-forward", o.strategy.reshard_after_forward,
                 "zero3/hybrid: free gathered params after each unit's forward (true/false)");
  app.add_option("--max-inflight", o.strategy.max_inflight, "zero3/hybrid: gathered units alive at once");
  add_device_flag(app, o.placement.device,
                  "where to compute: cpu, or cuda (a GPU per rank: local rank modulo the visible GPUs)");
  const Choices<DType> dtypes = {{std::string(dtype_flag(DType::f32)), DType::f32},
                                 {std::string(dtype_flag(DType::bf16)), DType::bf16}};
  add_choice(app, "--param-dtype", o.placement.param_dtype, dtypes,
             "parameters and gradients: fp32, or bf16 (cuda) with an fp32 master copy and Adam state");
  add_choice(app, "--reduce-dtype", o.placement.reduce_dtype, dtypes,
             "dtype of the gradient collectives: fp32, or bf16 (cuda; half the traffic)");
  add_choice<CommBackend>(app, "--comm", o.comm, {{"mpi", CommBackend::mpi}, {"nccl", CommBackend::nccl}},
                          "collectives: mpi, or nccl (cuda) [default: nccl on cuda, mpi on cpu]");
  add_offload_flag(app, o.placement.offload_optimizer);
  app.add_option("--comm-timeout", o.comm_timeout_s, "seconds a collective may take before the job aborts");
  app.add_option("--trace-dir", o.trace_dir,
                 "record each rank's last collectives and write them to DIR/rank-NNNNN.trace when the job fails "
                 "(deadline, error, fatal signal, SIGTERM) or on SIGUSR1 (then go on); read them with "
                 "zshard-trace DIR [default: none, nothing recorded]");
  app.add_flag("--check-collectives", o.check_collectives,
               "debug: at every step boundary compare the collectives every rank issued on each group; the first "
               "divergence stops the job naming both sides");
  add_choice<bool>(app, "--mem-check", o.mem_check, {{"on", true}, {"off", false}},
                   "refuse at set-up a run whose memory estimate exceeds what each rank can use: on, off");
  add_checkpointing_flag(app, o.activation_checkpointing);
  app.add_option("--eval-data", o.eval_data,
                 "held-out data to evaluate on, as --data: 'default', a text file or an llm.c .bin token file");
  app.add_option("--eval-every", o.eval_every,
                 "evaluate every N steps and after the last (0 = never): the mean token loss over --eval-batches");
  app.add_option("--eval-batches", o.eval_batches,
                 "--eval-every: global batches (--batch x --seq tokens each) from the start of --eval-data");
  app.add_option("--log-json", o.log_json, "write one JSON object per step to this file");
  app.add_option("--log-every", o.log_every, "progress line every N steps");
  app.add_option("--save", o.save, "save the final weights (safetensors)");
  app.add_option("--mem-report", o.mem_report, "write the memory report as JSON to this file");
  app.add_option("--save-dir", o.save_dir, "write checkpoints into DIR/step-NNNNNNNN (with a final save)");
  app.add_option("--save-every", o.save_every, "checkpoint every N steps (0 = only the final save)");
  app.add_option("--keep", o.keep, "keep the newest K checkpoints in --save-dir (0 = all)");
  app.add_option("--resume", o.resume,
                 "continue from a checkpoint directory, or 'latest' (newest committed in --save-dir); "
                 "any world size and strategy");
}

void refuse_empty_values(CLI::App& app) {
  const CLI::Validator non_empty(
      [](const std::string& v) { return v.empty() ? std::string("empty value (leave the flag out for its default)") : ""; },
      "");
  for (CLI::Option* opt : app.get_options())
    if (opt->get_type_size_max() > 0) opt->check(non_empty);
}

std::string cli_error_line(const CLI::Error& e) {
  std::string msg = e.what();
  while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
  for (char& c : msg) if (c == '\n') c = ' ';
  return msg;
}

}  // namespace zshard
