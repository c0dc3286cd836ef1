#include "runtime/cli/output_options.h"

#include <zshard/error.h>

#include "runtime/cli/flags.h"

namespace zshard {

void add_output_flags(CLI::App& app, OutputOptions& o) {
  app.add_option("--log-json", o.log_json, "write one JSON object per step to this file");
  app.add_option("--log-every", o.log_every, "progress line every N steps");
  app.add_option("--save", o.save, "save the final weights (safetensors)");
  app.add_option("--mem-report", o.mem_report, "write the memory report as JSON to this file");
  app.add_option("--trace-dir", o.trace_dir,
                 "record each rank's last collectives and write them to DIR/rank-NNNNN.trace when the job fails "
                 "(deadline, error, fatal signal, SIGTERM) or on SIGUSR1 (then go on); read them with "
                 "zshard-trace DIR [default: none, nothing recorded]");
  app.add_flag("--check-collectives", o.check_collectives,
               "debug: at every step boundary compare the collectives every rank issued on each group; the first "
               "divergence stops the job naming both sides");
}

void add_save_flags(CLI::App& app, SaveOptions& o) {
  app.add_option("--save-dir", o.save_dir, "write checkpoints into DIR/step-NNNNNNNN (with a final save)");
  app.add_option("--save-every", o.save_every, "checkpoint every N steps (0 = only the final save)");
  add_choice<SaveMode>(app, "--save-mode", o.mode, {{"async", SaveMode::async}, {"sync", SaveMode::sync}},
                       "how --save-every saves are written: async (by a background thread while training goes "
                       "on, from a host copy of what training would change first; committed once every rank's "
                       "file is written) or sync (training waits for the files)");
  app.get_option("--save-mode")->needs(app.get_option("--save-dir"));  // as --save-every and --keep do
  app.add_option("--keep", o.keep,
                 "keep the newest K checkpoints in --save-dir (0 = all); until the run ends, the newest one "
                 "dropped stays as --save-dir/step-spare, whose files the next save writes over");
  app.add_option("--resume", o.resume,
                 "continue from a checkpoint directory, or 'latest' (newest committed in --save-dir); "
                 "any world size and strategy");
  app.add_option("--stop-file", o.stop_file,
                 "stop after the step at whose end this file exists, as on SIGTERM: save into --save-dir and "
                 "exit 0; the file is removed (rank 0 looks for it; zshard-run stops its job this way)");
}

void validate(const OutputOptions& o) {
  if (o.log_every < 1) throw UsageError(detail::concat("--log-every must be >= 1, got ", o.log_every));
}

void validate(const SaveOptions& o) {
  if (o.save_every < 0)
    throw UsageError(detail::concat("--save-every must be >= 0 (0 = only the final save), got ", o.save_every));
  if (o.keep < 0) throw UsageError(detail::concat("--keep must be >= 0 (0 keeps every checkpoint), got ", o.keep));
  if (o.save_dir.empty() && (o.save_every > 0 || o.keep > 0))
    throw UsageError("--save-every and --keep need --save-dir");
  if (o.resume == "latest" && o.save_dir.empty()) throw UsageError("--resume latest needs --save-dir (where to look)");
}

}  // namespace zshard
