#include "runtime/train/step_log.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <utility>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm/agreed_failure.h"
#include "kernels/io/atomic_file.h"
#include "runtime/cli/path_checks.h"

namespace zshard {

nlohmann::json step_record(const StepResult& r) {
  nlohmann::json j = {{"step", r.step},           {"loss", r.loss},
                      {"lr", r.lr},               {"grad_norm", r.grad_norm},
                      {"ms", r.ms},               {"tokens_per_s", r.tokens_per_s},
                      {"comm_bytes", r.comm_bytes}, {"comm_exposed_ms", r.comm_exposed_ms},
                      {"rank_batches", r.rank_batches}};
  if (!std::isnan(r.eval_loss)) j["eval_loss"] = r.eval_loss;
  return j;
}

StepLog::StepLog(const std::string& path, comm::Communicator& world, const std::vector<FlagPath>& taken)
    : path_(path) {
  run_agreed(world, [&] {
    if (path_.empty() || world.rank() != 0) return;
    check_output_path("--step-log", path_);
    check_not_input({"--step-log", path_}, taken);
    // Emptied at the first catch_up, not here: a resume that its checks refuse leaves the log as it was.
    std::error_code ec;
    if (!std::filesystem::exists(path_, ec)) {
      create_ = true;  // check_output_path found its directory writable
      return;
    }
    fd_ = open_for_writing(path_, O_APPEND);
    if (fd_ < 0) throw UsageError(detail::concat("--step-log ", path_, ": cannot open (", open_error(path_, errno), ")"));
  });
}

StepLog::~StepLog() {
  if (fd_ >= 0) ::close(fd_);
}

void StepLog::catch_up(const std::vector<StepResult>& history) {
  if (std::exchange(create_, false)) {
    fd_ = open_for_writing(path_, O_CREAT | O_APPEND);
    if (fd_ < 0)
      std::cerr << "zshard-train: --step-log " << path_ << ": cannot create (" << open_error(path_, errno)
                << "); training goes on without it\n";
  }
  struct stat st {};
  if (fd_ >= 0 && !emptied_ && ::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode) && ::ftruncate(fd_, 0) != 0) {
    std::cerr << "zshard-train: --step-log " << path_ << ": cannot empty it (" << std::strerror(errno)
              << "); training goes on without it\n";
    ::close(fd_);
    fd_ = -1;
  }
  emptied_ = true;
  for (; written_ < history.size(); ++written_) {
    if (fd_ < 0) continue;
    const std::string line = step_record(history[written_]).dump() + "\n";
    // A log that stops being writable (a full disk) must not end the training it only reports on.
    if (write_without_sigpipe(fd_, line.data(), line.size()) != ssize_t(line.size())) {
      std::cerr << "zshard-train: --step-log " << path_ << ": write failed (" << std::strerror(errno)
                << "); training goes on without it\n";
      ::close(fd_);
      fd_ = -1;
    }
  }
}

}  // namespace zshard
