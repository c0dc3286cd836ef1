// Per-step records: the JSON object --log-json writes for each step, and --step-log, which appends each
// record the moment its step ends. --log-json is written whole when the run ends (complete or absent);
// --step-log is what a supervisor (zshard-run) reads while the run goes on, and what is left of a run
// that is killed: every step it finished, one line each.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <zshard/communicator.h>

#include "kernels/io/atomic_file.h"
#include "runtime/cli/path_checks.h"
#include "runtime/train/trainer.h"

namespace zshard {

// {"step", "loss", "lr", "grad_norm", "ms", "tokens_per_s", "comm_bytes", "comm_exposed_ms",
// "rank_batches"[, "eval_loss"]}.
nlohmann::json step_record(const StepResult& r);

class StepLog {
 public:
  // Rank 0 opens `path` at set-up, or, where there is no file yet, creates it at the first catch_up (a
  // set-up refused after this leaves none behind); a path that cannot be written, or one of the files
  // `taken` (the run's inputs and other outputs), fails on every rank alike. An empty path: a log that
  // writes nothing.
  StepLog(const std::string& path, comm::Communicator& world, const std::vector<FlagPath>& taken);
  ~StepLog();
  StepLog(const StepLog&) = delete;
  StepLog& operator=(const StepLog&) = delete;

  // Appends the steps of `history` not written yet, each line in one write(2): a reader sees whole lines
  // (or, while one is being written, a last line without its newline). The first call empties the file:
  // the run's set-up (a resume's checks) has passed.
  void catch_up(const std::vector<StepResult>& history);

 private:
  std::string path_;
  int fd_ = -1;  // rank 0 with a path only
  bool create_ = false;  // rank 0: no file at set-up, made at the first catch_up
  size_t written_ = 0;
  bool emptied_ = false;
};

}  // namespace zshard
