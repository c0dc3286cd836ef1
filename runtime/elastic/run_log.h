// The run's --log-json across the attempts of zshard-run. Each attempt appends its steps to a --step-log of
// its own as they end, so what a killed attempt did is kept; the launcher merges them into one record per
// step. An attempt that resumed after step R redoes every step past R, so each record an earlier attempt
// left past R gives way to the new attempt's: the log is the history of the weights the run goes on from.
#pragma once
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zshard::elastic {

// Reads a --step-log as it grows: each call returns the records of the lines completed since the last
// one. A last line without its newline is being written (or was, when the writer was killed): left for
// the next call. A file not there yet has no records.
class StepLogReader {
 public:
  explicit StepLogReader(std::string path) : path_(std::move(path)) {}
  std::vector<nlohmann::json> read_new();

 private:
  std::string path_;
  long offset_ = 0;
};

class RunLog {
 public:
  // A new attempt that resumed after `resumed_step` (0: from the start): the records past it are dropped.
  void begin_attempt(int resumed_step);
  // A record of the current attempt (a step record as --log-json writes it, with "step").
  void add(const nlohmann::json& record);
  int last_step() const { return records_.empty() ? 0 : records_.rbegin()->first; }
  // One record a line, in step order: --log-json's form.
  std::string text() const;

 private:
  std::map<int, nlohmann::json> records_;
};

}  // namespace zshard::elastic
