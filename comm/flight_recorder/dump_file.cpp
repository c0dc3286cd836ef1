#include "comm/flight_recorder/dump_file.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <zshard/error.h>

#include "comm/rank_list.h"
#include "kernels/io/file_kind.h"

namespace zshard::comm::trace {

uint32_t checksum(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t hash = 2166136261u;
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 16777619u;
  return hash;
}

std::string_view state_name(State s) {
  switch (s) {
    case State::in_flight: return "in flight";
    case State::completed: return "completed";
    case State::timed_out: return "timed out";
    case State::failed: return "failed";
    case State::waiting: return "waiting";
  }
  return "?";
}

std::string_view purpose_name(Purpose p) {
  switch (p) {
    case Purpose::other: return "";
    case Purpose::params: return "params";
    case Purpose::grads: return "grads";
    case Purpose::grads_across: return "grads across groups";
    case Purpose::grad_norm: return "grad norm";
    case Purpose::check: return "collective check";
    case Purpose::step_tokens: return "step tokens";
    case Purpose::step_loss: return "step loss";
  }
  return "?";
}

std::string_view reason_name(Reason r) {
  switch (r) {
    case Reason::request: return "on request (SIGUSR1)";
    case Reason::abort: return "job aborted by this rank";
    case Reason::fatal_signal: return "fatal signal";
    case Reason::terminated: return "terminated";
  }
  return "?";
}

namespace {

template <class Part>
bool sealed(const Part& part) {
  return part.checksum == checksum(&part, sizeof(Part) - sizeof(part.checksum));
}

// A fixed-size text field holds its terminating zero.
template <size_t N>
bool terminated(const char (&text)[N]) {
  return std::memchr(text, '\0', N) != nullptr;
}

bool valid_record(const Record& r, uint32_t groups) {
  return r.seq > 0 && r.group_seq > 0 && r.group >= 0 && uint32_t(r.group) < groups && r.unit >= -1 &&
         r.root >= -1 && r.op < kNumCollectives && r.dtype <= uint8_t(DType::u16) &&
         (r.reduce == kNoReduce || r.reduce <= uint8_t(ReduceOp::avg)) &&
         r.purpose <= uint8_t(Purpose::step_loss) && r.state >= uint8_t(State::in_flight) &&
         r.state <= uint8_t(State::waiting);
}

}  // namespace

RankTrace read_trace(const std::string& path) {
  const auto bad = [&](const auto&... why) -> Error { return Error(detail::concat(path, ": ", why...)); };
  // Refused, not opened: a FIFO's open would wait for a writer forever, a device would never end.
  std::error_code ec;
  if (const std::string_view what = unreadable_kind(std::filesystem::status(path, ec).type()); !what.empty())
    throw UsageError(detail::concat(path, ": is ", what, ", not a flight-recorder dump"));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw bad("cannot open (", std::strerror(errno), ")");
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) throw bad("cannot read its size (", ec.message(), ")");
  RankTrace t;
  t.path = path;
  if (size < sizeof t.header)
    throw bad("truncated: ", size, " bytes, shorter than the ", sizeof t.header, "-byte header of a zshard trace");
  in.read(reinterpret_cast<char*>(&t.header), sizeof t.header);
  const FileHeader& h = t.header;
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) throw bad("not a zshard trace (bad magic)");
  if (h.version != kVersion) throw bad("trace format version ", h.version, ", this zshard reads version ", kVersion);
  if (!sealed(h)) throw bad("corrupt: the header fails its checksum");
  if (h.header_bytes != sizeof(FileHeader) || h.group_bytes != sizeof(GroupEntry) ||
      h.record_bytes != sizeof(Record) || h.world_size < 1 || h.rank < 0 || h.rank >= h.world_size ||
      h.reason < uint8_t(Reason::request) || h.reason > uint8_t(Reason::terminated) || !terminated(h.host) ||
      h.record_count > h.ring_capacity)
    throw bad("corrupt: impossible values in the header");
  const uint64_t expected = uint64_t(h.header_bytes) + uint64_t(h.group_count) * h.group_bytes +
                            uint64_t(h.record_count) * h.record_bytes;
  if (size < expected)
    throw bad("truncated: ", size, " bytes, the header counts ", expected, " (", h.group_count, " groups, ",
              h.record_count, " records)");
  if (size > expected) throw bad("corrupt: ", size - expected, " bytes past the ", h.record_count, " records the header counts");
  t.groups.resize(h.group_count);
  in.read(reinterpret_cast<char*>(t.groups.data()), std::streamsize(t.groups.size() * sizeof(GroupEntry)));
  t.records.resize(h.record_count);
  in.read(reinterpret_cast<char*>(t.records.data()), std::streamsize(t.records.size() * sizeof(Record)));
  if (!in) throw bad("read error");
  for (size_t i = 0; i < t.groups.size(); ++i) {
    const GroupEntry& g = t.groups[i];
    if (!sealed(g)) throw bad("corrupt: group ", i, " fails its checksum");
    if (!terminated(g.key) || !terminated(g.label) || g.key[0] == '\0' || g.size < 1 || g.rank < 0 || g.rank >= g.size)
      throw bad("corrupt: impossible values in group ", i);
  }
  uint64_t previous = 0;
  for (size_t i = 0; i < t.records.size(); ++i) {
    const Record& r = t.records[i];
    if (!sealed(r)) throw bad("corrupt: record ", i, " fails its checksum");
    if (!valid_record(r, h.group_count) || r.seq <= previous || r.seq > h.issued ||
        r.group_seq > t.groups[size_t(r.group)].issued)
      throw bad("corrupt: impossible values in record ", i);
    previous = r.seq;
  }
  return t;
}

}  // namespace zshard::comm::trace

namespace zshard::comm {

Signature signature_of(const trace::Record& r) {
  return {r.count, r.unit, r.root, r.op, r.dtype, r.reduce, r.purpose};
}

std::string describe_parting(const std::vector<std::pair<int, std::optional<Signature>>>& members,
                             const std::function<std::optional<Signature>(int rank)>& next) {
  std::vector<std::pair<std::optional<Signature>, std::vector<int>>> sides;
  for (const auto& [rank, sig] : members) {
    auto side = std::find_if(sides.begin(), sides.end(), [&](const auto& e) { return e.first == sig; });
    if (side == sides.end()) sides.push_back({sig, {rank}});
    else side->second.push_back(rank);
  }
  if (sides.size() < 2) return "";
  // The most ranks first, so that a lone rank reads as the one that left the others.
  std::stable_sort(sides.begin(), sides.end(), [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
  const std::optional<Signature>& most = sides[0].first;
  const std::optional<Signature> most_next = next ? next(sides[0].second[0]) : std::nullopt;
  const auto issued = [](const std::optional<Signature>& sig) {
    return sig ? "issued " + describe(*sig) : std::string("issued nothing there");
  };
  std::string text;
  for (size_t k = 1; k < sides.size(); ++k) {
    const auto& [sig, ranks] = sides[k];
    text += detail::concat(k > 1 ? "; " : "", rank_list(ranks), " ");
    if (sig && most && most_next && *sig == *most_next)
      text += detail::concat("skipped ", describe(*most), ", issuing ", describe(*sig), " in its place");
    else text += issued(sig);
  }
  return text + "; " + rank_list(sides[0].second) + " " + issued(most);
}

std::string describe(const Signature& s) {
  std::string text = detail::concat(collective_name(Collective(s.op)), " of ", s.count, " ", dtype_name(DType(s.dtype)));
  if (s.reduce != trace::kNoReduce) text += ReduceOp(s.reduce) == ReduceOp::avg ? " (avg)" : " (sum)";
  if (s.root >= 0) text += detail::concat(" from root ", s.root);
  const std::string_view purpose = trace::purpose_name(trace::Purpose(s.purpose));
  if (!purpose.empty() || s.unit >= 0)
    text += detail::concat(" (", purpose, !purpose.empty() && s.unit >= 0 ? ", " : "",
                           s.unit >= 0 ? "unit " + std::to_string(s.unit) : "", ")");
  return text;
}

}  // namespace zshard::comm
