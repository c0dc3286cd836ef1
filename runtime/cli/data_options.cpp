#include "runtime/cli/data_options.h"

#include <cstdint>

#include <zshard/error.h>
#include <zshard/plan.h>

#include "runtime/cli/memory_flags.h"
#include "shard/memory/estimator.h"
#include "runtime/cli/flags.h"
#include "shard/plan_internals.h"

namespace zshard {

int64_t default_auto_batch_tokens(Device device) { return device == Device::cpu ? 4096 : 65536; }

void add_data_flags(CLI::App& app, DataOptions& o) {
  app.add_option("--data", o.source, "'default' (embedded text), a text file (bytes) or an llm.c .bin token file");
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
               if (o.rank_batches_auto) throw CLI::ValidationError("--rank-batches", "auto is given twice");
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
  add_choice<bool>(app, "--mem-check", o.mem_check, {{"on", true}, {"off", false}},
                   "refuse at set-up a run whose memory estimate exceeds what each rank can use: on, off");
}

void add_eval_flags(CLI::App& app, EvalOptions& o) {
  app.add_option("--eval-data", o.source,
                 "held-out data to evaluate on, as --data: 'default', a text file or an llm.c .bin token file");
  app.add_option("--eval-every", o.every,
                 "evaluate every N steps and after the last (0 = never): the mean token loss over --eval-batches");
  app.add_option("--eval-batches", o.batches,
                 "--eval-every: steps' worth (--batch x --grad-accum x --seq tokens each) from the start of "
                 "--eval-data");
}

void validate(const DataOptions& o, int world_size) {
  if (o.batch < 1) refuse("--batch must be >= 1, got ", o.batch);
  if (o.seq < 1) refuse("--seq must be >= 1, got ", o.seq);
  if (o.grad_accum < 1) refuse("--grad-accum must be >= 1, got ", o.grad_accum);
  if (o.grad_accum > kMaxGradAccum) refuse("--grad-accum must be at most ", kMaxGradAccum, ", got ", o.grad_accum);
  if (!o.mem_budget.empty()) {
    if (!o.auto_batch) refuse("--mem-budget is the budget of --batch auto (give --batch auto, or drop it)");
    parse_bytes(o.mem_budget, "--mem-budget");
  }
  if (o.auto_batch && !o.rank_batches.empty())
    refuse("--batch auto and --rank-batches exclude each other (give --batch N with --rank-batches)");
  if (o.rebalance_every) {
    if (*o.rebalance_every < 0) refuse("--rebalance-every must be >= 0 (0 = never), got ", *o.rebalance_every);
    if (!o.rank_batches_auto) refuse("--rebalance-every is only for --rank-batches auto");
  }
  if (o.max_rank_batch) {
    if (*o.max_rank_batch < 1) refuse("--max-rank-batch must be >= 1, got ", *o.max_rank_batch);
    if (!o.rank_batches_auto) refuse("--max-rank-batch is only for --rank-batches auto");
    if (int64_t(*o.max_rank_batch) * world_size < o.batch)
      refuse("--max-rank-batch ", *o.max_rank_batch, " on ", world_size, " ranks holds fewer than --batch ", o.batch,
            " sequences");
  }
  if (o.auto_batch && o.rank_batches_auto)
    refuse("--batch auto and --rank-batches auto exclude each other (fix --batch N to balance it across ranks)");
  if (o.rank_batches_auto && !o.rank_batches.empty())
    refuse("--rank-batches auto takes no sizes beside it, got auto and ", join_sizes(o.rank_batches));
  if (!o.rank_batches.empty()) {
    if (int(o.rank_batches.size()) != world_size)
      refuse("--rank-batches has ", o.rank_batches.size(), " entries but the world has ", world_size,
            " ranks (one entry per rank)");
    int64_t sum = 0;
    for (int b : o.rank_batches) {
      if (b < 1) refuse("--rank-batches: every rank needs at least one sequence, got ", b);
      sum += b;
    }
    if (sum != o.batch) refuse("--rank-batches sums to ", sum, " but --batch is ", o.batch);
  } else if (o.batch < world_size) {
    refuse("--batch ", o.batch, " is smaller than the world size ", world_size, ": every rank needs at least one sequence");
  }
}

void validate(const EvalOptions& o) {
  if (o.every < 0) refuse("--eval-every must be >= 0 (0 = never), got ", o.every);
  if (o.batches < 1) refuse("--eval-batches must be >= 1, got ", o.batches);
  if (o.every > 0 && o.source.empty()) refuse("--eval-every needs --eval-data (what to evaluate on)");
  if (o.every == 0 && (!o.source.empty() || o.batches != EvalOptions{}.batches))
    refuse(o.source.empty() ? "--eval-batches" : "--eval-data", " is only for --eval-every N (how often to evaluate)");
}

std::vector<int> split_batch(const DataOptions& o, int world_size) {
  if (!o.rank_batches.empty()) return o.rank_batches;
  std::vector<int> b(size_t(world_size), o.batch / world_size);
  for (int r = 0; r < o.batch % world_size; ++r) ++b[size_t(r)];
  return b;
}

}  // namespace zshard
