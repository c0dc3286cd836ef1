#include "runtime/cli/train_options.h"

#include <filesystem>

#include <CLI/CLI.hpp>

#include <zshard/error.h>

#include "kernels/io/atomic_file.h"
#include "models/lora.h"
#include "runtime/cli/path_checks.h"
#include "runtime/cli/plan_flags.h"
#include "shard/checkpoint_format.h"

namespace zshard {

void add_train_flags(CLI::App& app, TrainOptions& o) {
  app.option_defaults()->always_capture_default();
  add_model_flags(app, o.model);
  add_data_flags(app, o.data);
  add_optimizer_flags(app, o.optimizer);
  add_plan_flags(app, o.plan);
  add_eval_flags(app, o.eval);
  add_output_flags(app, o.output);
  add_save_flags(app, o.saves);
}

BatchShape batch_shape(const TrainOptions& o) {
  const DataOptions& d = o.data;
  return {d.batch, d.seq, d.grad_accum, d.rank_batches.empty(), o.saves.snapshots(), o.model.freeze,
          !o.model.init_from.empty()};
}

void validate_options(const TrainOptions& o, int world_size) {
  validate_plan_options(o.plan);
  validate(o.data, world_size);
  validate(o.optimizer);
  validate(o.eval);
  validate(o.output);
  validate(o.saves);
  // Groups that do not fit the world; node groups need the hosts, which resolve_plan checks them against.
  if (o.plan.strategy.shard_group.kind() != ShardGroupRequest::Kind::node) shard_groups(o.plan.strategy, world_size);
  if (o.data.auto_batch && !o.saves.resume.empty())
    refuse("--batch auto and --resume exclude each other (resume with the --batch the run chose)");
}

namespace {

// A LoRA run's adapter file has PEFT's adapter_config.json beside it: read with the adapters, written with
// --save.
bool saves_adapters(const TrainOptions& o) { return o.model.overrides.count("lora_rank") > 0; }

// The adapter_config.json beside a LoRA run's --init-from file, where one stands: the loaded adapters'.
std::string loaded_adapter_config(const TrainOptions& o, const std::string& weights) {
  if (!saves_adapters(o) || weights.empty()) return "";
  std::error_code ec;
  const std::string config = adapter_config_path(weights);
  return std::filesystem::exists(config, ec) ? config : "";
}

std::vector<FlagPath> named_inputs(const TrainOptions& o) {
  return {{"--init-from", o.model.init_from},
          {"--init-from", o.model.init_adapters},
          {"--init-from", loaded_adapter_config(o, o.model.init_from)},
          {"--init-from", loaded_adapter_config(o, o.model.init_adapters)},
          {"--data", o.data.source == "default" ? "" : o.data.source},
          {"--eval-data", o.eval.source == "default" ? "" : o.eval.source},
          {"--resume", o.saves.resume == "latest" ? "" : o.saves.resume}};
}

std::vector<FlagPath> named_outputs(const TrainOptions& o) {
  const bool config_beside = saves_adapters(o) && !o.output.save.empty();
  return {{"--log-json", o.output.log_json},
          {"--save", o.output.save},
          {"--save's adapter_config.json", config_beside ? adapter_config_path(o.output.save) : ""},
          {"--mem-report", o.output.mem_report}};
}

// A path among the step-* checkpoint directories a run writes under --save-dir (or one of them, as a file):
// the run's saves and prunes would remove it, or fail on it.
void check_not_in_a_checkpoint(const FlagPath& file, const std::string& save_dir) {
  if (save_dir.empty() || file.second.empty()) return;
  const std::filesystem::path in_save = normal_path(file.second).lexically_relative(normal_path(save_dir));
  const std::string first = in_save.empty() ? "" : in_save.begin()->string();
  if (first == "step-spare" || step_of_dir(first))
    refuse(file.first, " ", file.second, ": inside what the run writes under --save-dir (its step-* checkpoints), ",
           "which its saves would remove or fail on; give a file beside them");
}

// The stop file is removed once seen, so it may be no file the run reads or writes; a directory there would
// be taken for a request and removed.
void check_stop_file(const TrainOptions& o) {
  const FlagPath stop{"--stop-file", o.saves.stop_file};
  if (stop.second.empty()) return;
  std::error_code ec;
  if (std::filesystem::is_directory(stop.second, ec))
    refuse("--stop-file ", stop.second, ": is a directory (the stop file is one the run removes once it appears)");
  // Under a file, it could never appear: the run would never stop on it.
  for (std::filesystem::path up = normal_path(stop.second).parent_path(); !up.empty() && up != up.root_path();
       up = up.parent_path())
    if (std::filesystem::exists(up, ec)) {
      if (!std::filesystem::is_directory(up, ec))
        refuse("--stop-file ", stop.second, ": ", up.string(), " is a file, so the stop file could never appear");
      break;
    }
  std::vector<FlagPath> files = named_inputs(o);
  for (FlagPath& out : named_outputs(o)) files.push_back(std::move(out));
  check_not_input(stop, files, "remove");
  // The --save-dir and the directories above it, made at set-up, would be taken for a request once they
  // exist. Inside it, a file beside the checkpoints is fine (zshard-run's is SAVE_DIR/zshard-run/stop), not
  // one among them: a step's manifest, once committed, would be taken for a request and removed with its
  // checkpoint.
  const std::filesystem::path from_stop = normal_path(o.saves.save_dir).lexically_relative(normal_path(stop.second));
  if (!o.saves.save_dir.empty() && !from_stop.empty() && *from_stop.begin() != "..")
    refuse("--stop-file ", stop.second, " names the --save-dir or a directory above it, which set-up makes");
  check_not_in_a_checkpoint(stop, o.saves.save_dir);
  check_not_trace_dir(stop, o.output.trace_dir);
}

}  // namespace

void check_not_trace_dir(const FlagPath& file, const std::string& trace_dir) {
  if (file.second.empty() || trace_dir.empty()) return;
  if (normal_path(file.second) == normal_path(trace_dir))
    refuse(file.first, " ", file.second, " names the --trace-dir, where the ranks' traces go");
}

std::vector<FlagPath> named_files(const TrainOptions& o) {
  std::vector<FlagPath> files = named_inputs(o);
  for (FlagPath& out : named_outputs(o)) files.push_back(std::move(out));
  files.push_back({"--stop-file", o.saves.stop_file});
  return files;
}

void check_outputs(const TrainOptions& o) {
  const SaveOptions& s = o.saves;
  check_stop_file(o);
  std::vector<FlagPath> taken = named_inputs(o);
  check_not_input({"--save-dir", s.save_dir}, taken);
  check_not_trace_dir({"--save-dir", s.save_dir}, o.output.trace_dir);
  // A file may go inside an existing --save-dir, but one named as the directory would fail after training.
  std::error_code ec;
  const bool save_dir_exists = std::filesystem::is_directory(s.save_dir, ec);
  for (const FlagPath& out : named_outputs(o)) {
    if (out.second.empty()) continue;
    // A file straight inside the --save-dir this run creates (parents and all) at set-up, where a
    // directory that cannot be made is refused (SavePolicy), needs no directory yet.
    if (!inside_dir_not_made_yet(out.second, s.save_dir)) check_output_path(out.first, out.second);
    check_not_input(out, taken);
    check_not_in_a_checkpoint(out, s.save_dir);
    check_not_trace_dir(out, o.output.trace_dir);
    if (!save_dir_exists) check_not_input(out, {{"--save-dir", s.save_dir}});
    taken.push_back(out);
  }
}

}  // namespace zshard
