// What a run writes, and its flags: the progress and the JSON log, the final weights, the memory report
// and the collectives' diagnostics (OutputOptions), and checkpoints with resume (SaveOptions, which
// runtime/train/save_policy.h acts on).
#pragma once
#include <string>

#include "runtime/cli/cli_fwd.h"

namespace zshard {

struct OutputOptions {
  std::string log_json;
  std::string save;
  std::string mem_report;
  int log_every = 10;
  std::string trace_dir;           // --trace-dir: where each rank dumps its last collectives (comm/flight_recorder/recorder.h)
  bool check_collectives = false;  // --check-collectives (comm/collective_check.h)
};

// How --save-every checkpoints are written: async, by a thread beside training (shard/async_checkpoint.h;
// the final save waits for it), or sync, within the step boundary.
enum class SaveMode { sync, async };

struct SaveOptions {
  std::string save_dir;
  int save_every = 0;  // 0: only the final save
  SaveMode mode = SaveMode::async;
  int keep = 0;        // 0: keep every checkpoint
  std::string resume;  // a checkpoint directory, or "latest": the newest one in save_dir
  std::string stop_file;  // once it exists, the job stops after its step as on SIGTERM (rank 0 looks)
  // Whether the run holds an asynchronous save's host snapshot (periodic async saves).
  bool snapshots() const { return !save_dir.empty() && save_every > 0 && mode == SaveMode::async; }
};

void add_output_flags(CLI::App& app, OutputOptions& options);
void add_save_flags(CLI::App& app, SaveOptions& options);

// Throw UsageError naming the flag.
void validate(const OutputOptions& options);
void validate(const SaveOptions& options);

}  // namespace zshard
