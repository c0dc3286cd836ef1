#include "runtime/elastic/run_log.h"

#include <fstream>

#include <zshard/error.h>

namespace zshard::elastic {

std::vector<nlohmann::json> StepLogReader::read_new() {
  std::vector<nlohmann::json> records;
  std::ifstream in(path_, std::ios::binary);
  if (!in) return records;
  in.seekg(offset_);
  std::string line;
  while (std::getline(in, line) && !in.eof()) {  // eof: the line had no newline yet
    offset_ += long(line.size()) + 1;
    nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object() || !record.contains("step") || !record["step"].is_number_integer())
      throw Error(detail::concat(path_, ": not a step record: ", line.substr(0, 80)));
    records.push_back(std::move(record));
  }
  return records;
}

void RunLog::begin_attempt(int resumed_step) {
  records_.erase(records_.upper_bound(resumed_step), records_.end());
}

void RunLog::add(const nlohmann::json& record) { records_[record.at("step").get<int>()] = record; }

std::string RunLog::text() const {
  std::string text;
  for (const auto& [step, record] : records_) text += record.dump() + "\n";
  return text;
}

}  // namespace zshard::elastic
