#include "comm/flight_recorder/analysis.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <regex>

#include <zshard/error.h>

#include "comm/flight_recorder/recorder.h"
#include "comm/rank_list.h"
#include "kernels/io/fixed_text.h"

namespace zshard {

using comm::trace::GroupEntry;
using comm::trace::Purpose;
using comm::trace::RankTrace;
using comm::trace::Reason;
using comm::trace::Record;
using comm::trace::State;
using comm::rank_list;

namespace {

namespace fs = std::filesystem;

// A group as all its dumps see it: the same key on every member.
struct GroupView {
  std::string key, label;
  int size = 0;
  std::map<int, int> index;                             // world rank -> its index into that rank's groups
  std::map<int, std::map<uint64_t, const Record*>> by;  // world rank -> group number -> record
  std::string name() const { return label.empty() ? key : label; }
};

struct Job {
  std::vector<const RankTrace*> ranks;  // by world rank, null where a rank left no dump
  std::vector<GroupView> groups;        // in the order the lowest ranks made them
  int world = 0;
};

double seconds(int64_t ns) { return double(ns) / 1e9; }

// "#1842 (all_gather, params, unit 7, shard group 0)"
std::string short_name(const Record& r, const GroupView& g) {
  std::string text = detail::concat("#", r.group_seq, " (", comm::collective_name(comm::Collective(r.op)));
  const std::string_view purpose = comm::trace::purpose_name(Purpose(r.purpose));
  if (!purpose.empty()) text += detail::concat(", ", purpose);
  if (r.unit >= 0) text += detail::concat(", unit ", r.unit);
  return text + ", " + g.name() + ")";
}

bool open(const Record& r) { return State(r.state) != State::completed; }
// Its rank blocked on it (and may still be): a collective merely in flight overlaps the rank's compute.
bool blocked(const Record& r) { return open(r) && State(r.state) != State::in_flight; }

// How long rank `rank` waited in `r`: until it gave up, or until its dump.
double waited(const Job& job, int rank, const Record& r) {
  const bool gave_up = State(r.state) == State::timed_out || State(r.state) == State::failed;
  const int64_t end = gave_up && r.ended_ns > 0 ? r.ended_ns : job.ranks[size_t(rank)]->header.dump_steady_ns;
  return seconds(end - r.issued_ns);
}

Job line_up(const std::vector<const RankTrace*>& dumps) {
  Job job;
  job.world = dumps.front()->header.world_size;
  job.ranks.assign(size_t(job.world), nullptr);
  for (const RankTrace* t : dumps) {
    if (t->header.world_size != job.world)
      fail(t->path, ": a world of ", t->header.world_size, " ranks, where the job's other dumps have ", job.world);
    if (job.ranks[size_t(t->header.rank)])
      fail(t->path, ": a second dump of rank ", t->header.rank, " (beside ", job.ranks[size_t(t->header.rank)]->path, ")");
    job.ranks[size_t(t->header.rank)] = t;
  }
  std::map<std::string, size_t> by_key;
  for (int r = 0; r < job.world; ++r) {
    const RankTrace* t = job.ranks[size_t(r)];
    if (!t) continue;
    for (size_t i = 0; i < t->groups.size(); ++i) {
      const GroupEntry& e = t->groups[i];
      auto [it, added] = by_key.emplace(e.key, job.groups.size());
      if (added) job.groups.push_back({e.key, e.label, e.size, {}, {}});
      job.groups[it->second].index[r] = int(i);
    }
    for (const Record& rec : t->records) {
      GroupView& g = job.groups[by_key.at(t->groups[size_t(rec.group)].key)];
      g.by[r][rec.group_seq] = &rec;
    }
  }
  return job;
}

uint64_t issued(const Job& job, const GroupView& g, int rank) {
  return job.ranks[size_t(rank)]->groups[size_t(g.index.at(rank))].issued;
}

// The first collective at which a group's members recorded different signatures.
std::optional<std::string> disagreement(const Job& job) {
  for (const GroupView& g : job.groups) {
    std::map<uint64_t, std::vector<std::pair<int, const Record*>>> at;
    for (const auto& [rank, records] : g.by)
      for (const auto& [n, rec] : records) at[n].push_back({rank, rec});
    for (const auto& [n, seen] : at) {
      std::vector<std::pair<int, std::optional<comm::Signature>>> members;
      for (const auto& [rank, rec] : seen) members.push_back({rank, comm::signature_of(*rec)});
      const std::string parting = comm::describe_parting(members);
      if (!parting.empty()) return detail::concat("the ranks of ", g.name(), " disagree at its collective #", n, ": ", parting);
    }
  }
  return std::nullopt;
}

// The collective the rank blocked on, if any (the oldest, should there be several).
const Record* waiting_in(const RankTrace& t) {
  for (const Record& r : t.records)
    if (blocked(r)) return &r;
  return nullptr;
}

// A process that did not run this long was stopped or starved (its recorder's ticker notes every 100 ms).
constexpr int64_t kPausedNs = 1000000000;
// Collectives in flight for less than this are the normal state of a running job (a SIGUSR1 snapshot),
// unless one timed out or failed.
constexpr double kStalledSeconds = 1.0;

const GroupView& group_of(const Job& job, int rank, const Record& r) {
  const std::string key = job.ranks[size_t(rank)]->groups[size_t(r.group)].key;
  return *std::find_if(job.groups.begin(), job.groups.end(), [&](const GroupView& g) { return g.key == key; });
}

// The rank, other than those in `except`, that waited longest in a collective, and how long; -1 if none.
std::pair<int, double> longest_wait(const Job& job, const std::vector<int>& except = {}) {
  std::pair<int, double> longest{-1, 0.0};
  for (int r = 0; r < job.world; ++r) {
    if (!job.ranks[size_t(r)] || std::find(except.begin(), except.end(), r) != except.end()) continue;
    if (const Record* rec = waiting_in(*job.ranks[size_t(r)]); rec && waited(job, r, *rec) > longest.second)
      longest = {r, waited(job, r, *rec)};
  }
  return longest;
}

// "; the other ranks waited 5.0 s", or the ranks that did where not every other rank did.
std::string others_waited(const Job& job, const std::vector<int>& except) {
  std::vector<int> waiting;
  int dumped = 0;
  for (int r = 0; r < job.world; ++r) {
    if (!job.ranks[size_t(r)] || std::find(except.begin(), except.end(), r) != except.end()) continue;
    ++dumped;
    if (waiting_in(*job.ranks[size_t(r)])) waiting.push_back(r);
  }
  if (waiting.empty()) return "";
  return detail::concat("; ", int(waiting.size()) == dumped ? "the other ranks" : rank_list(waiting), " waited ",
                        fixed(longest_wait(job, except).second), " s");
}

// Ranks that did not run (stopped, or starved of CPU) for a second or more while the others waited: the
// cause, wherever they stopped. A pause that ended long before the waits began is not.
std::optional<std::string> stopped_verdict(const Job& job) {
  const auto [waiter, longest] = longest_wait(job);
  if (longest < kStalledSeconds) return std::nullopt;
  std::vector<int> ranks;
  for (int r = 0; r < job.world; ++r) {
    const RankTrace* t = job.ranks[size_t(r)];
    if (t && t->header.paused_ns >= kPausedNs && seconds(t->header.paused_ago_ns) <= longest + 1) ranks.push_back(r);
  }
  if (ranks.empty()) return std::nullopt;
  const RankTrace& first = *job.ranks[size_t(ranks[0])];
  const std::string paused = fixed(seconds(first.header.paused_ns));
  const Record* where = waiting_in(first);
  if (where && where->issued_ns <= first.header.dump_steady_ns - first.header.paused_ago_ns)
    return detail::concat(rank_list(ranks), " stopped running inside collective ",
                          short_name(*where, group_of(job, ranks[0], *where)), " for ", paused, " s",
                          others_waited(job, ranks));
  const auto [other, waited_s] = longest_wait(job, ranks);
  std::string text = detail::concat(rank_list(ranks), " stopped running for ", paused, " s outside any collective");
  if (other < 0) return text;
  const Record& theirs = *waiting_in(*job.ranks[size_t(other)]);
  return text + detail::concat(others_waited(job, ranks), " in collective ", short_name(theirs, group_of(job, other, theirs)));
}

struct Stall {
  const GroupView* group = nullptr;
  const Record* record = nullptr;    // as the longest waiter recorded it
  std::vector<int> waiters, absent;  // ranks inside the collective, and ranks that had not issued it
  std::vector<int> completed;        // members on which it completed
  // Members that issued it, but blocked on no collective at all: computing, or stopped outside a wait,
  // while MPI moves a non-blocking collective only inside the calls of all its ranks.
  std::vector<int> idle;
  int undumped = 0;                  // members that left no dump
  double waited = 0;                 // the longest wait
  bool ended = false;                // a waiter's wait timed out or failed
  bool absent_busy = false;          // an absent rank was itself waiting in another collective
  bool culprit() const { return !absent.empty() || undumped > 0 || !idle.empty(); }
  // --check-collectives' own comparison, which a failed step's ranks join while they unwind: its wait
  // follows the stall that failed the step, and outlasts it.
  bool checking() const { return Purpose(record->purpose) == Purpose::check; }
  bool stalled() const { return ended || waited >= kStalledSeconds; }
};

std::vector<Stall> stalls(const Job& job) {
  std::vector<Stall> found;
  for (const GroupView& g : job.groups) {
    // The first collective of the group a rank blocked on: its members either entered it (it is open on
    // them, or ended), or never issued it.
    std::optional<uint64_t> first_blocked;
    for (const auto& [rank, records] : g.by)
      for (const auto& [n, rec] : records)
        if (blocked(*rec)) first_blocked = std::min(first_blocked.value_or(n), n);
    if (!first_blocked) continue;
    const uint64_t n = *first_blocked;
    Stall s;
    s.group = &g;
    s.undumped = g.size - int(g.index.size());
    for (const auto& [rank, index] : g.index) {
      const auto records = g.by.find(rank);
      const Record* rec = nullptr;
      if (records != g.by.end() && records->second.count(n)) rec = records->second.at(n);
      if (rec && blocked(*rec)) {
        s.waiters.push_back(rank);
        s.ended = s.ended || State(rec->state) == State::timed_out || State(rec->state) == State::failed;
        const double w = waited(job, rank, *rec);
        if (!s.record || w > s.waited) s.record = rec;
        s.waited = std::max(s.waited, w);
      } else if (issued(job, g, rank) < n) {
        s.absent.push_back(rank);
        s.absent_busy = s.absent_busy || waiting_in(*job.ranks[size_t(rank)]) != nullptr;
      } else if (!waiting_in(*job.ranks[size_t(rank)])) {
        s.idle.push_back(rank);
      } else {
        s.completed.push_back(rank);
      }
    }
    if (s.stalled()) found.push_back(std::move(s));
  }
  // The cause first: the job's own collectives before the collective check's, a rank that left the others
  // waiting and was not waiting on anyone itself, then the longest wait.
  std::stable_sort(found.begin(), found.end(), [](const Stall& a, const Stall& b) {
    if (a.checking() != b.checking()) return b.checking();
    if (a.culprit() != b.culprit()) return a.culprit();
    if (a.absent_busy != b.absent_busy) return !a.absent_busy;
    return a.waited > b.waited;
  });
  return found;
}

std::string stall_verdict(const Job& job, const Stall& s) {
  const std::string what = short_name(*s.record, *s.group);
  const size_t named = s.absent.size() + size_t(s.undumped) + s.idle.size();
  const std::string waiters = named == 1 && s.waiters.size() + 1 == size_t(s.group->size) ? "the other ranks"
                                                                                            : rank_list(s.waiters);
  const std::string wait = detail::concat("; ", waiters, " waited ", fixed(s.waited), " s");
  std::vector<int> undumped;
  for (int r = 0; r < job.world; ++r)
    if (!job.ranks[size_t(r)]) undumped.push_back(r);
  std::string missing;
  if (s.undumped > 0)
    missing = size_t(s.undumped) == undumped.size()
                  ? rank_list(undumped)
                  : detail::concat(s.undumped, " of the ranks without a dump (", rank_list(undumped), ")");
  if (!s.absent.empty()) {
    std::string text = rank_list(s.absent) + " never entered collective " + what;
    if (!missing.empty()) text += ", nor did " + missing + ", which left no dump";
    return text + wait;
  }
  if (!missing.empty()) return missing + " left no dump and never completed collective " + what + wait;
  if (!s.idle.empty())
    return rank_list(s.idle) + " stalled outside any wait, leaving collective " + what + " unfinished" + wait;
  return detail::concat("every rank of ", s.group->name(), " entered collective ", what,
                        s.completed.empty() ? "" : ", " + rank_list(s.completed) + " completed it",
                        "; it never completed on ", rank_list(s.waiters), " (a link or a device failed?), which waited ",
                        fixed(s.waited), " s");
}

// No rank waited on another, but one ended the job: an error of its own (which its output names) or a
// fatal signal. The others' dumps say they were terminated.
std::optional<std::string> ended_verdict(const Job& job) {
  std::vector<int> aborted, signalled;
  int signal = 0;
  for (int r = 0; r < job.world; ++r) {
    const RankTrace* t = job.ranks[size_t(r)];
    if (t && Reason(t->header.reason) == Reason::abort) aborted.push_back(r);
    if (t && Reason(t->header.reason) == Reason::fatal_signal) {
      signalled.push_back(r);
      signal = t->header.signal;
    }
  }
  if (!signalled.empty())
    return detail::concat(rank_list(signalled), " ended the job on a fatal signal (", signal,
                          ") before any rank waited long on another");
  if (!aborted.empty())
    return rank_list(aborted) + (aborted.size() == 1 ? " ended the job on an error of its own" : " ended the job on errors of their own") +
           " (the job's output says which) before any rank waited long on another";
  return std::nullopt;
}

// No rank waited on another: the job was running when it dumped.
std::string running_verdict(const Job& job) {
  int dumped = 0, oldest_rank = -1;
  const Record* oldest = nullptr;
  for (int r = 0; r < job.world; ++r) {
    const RankTrace* t = job.ranks[size_t(r)];
    if (!t) continue;
    ++dumped;
    const auto rec = std::find_if(t->records.begin(), t->records.end(), [](const Record& x) { return open(x); });
    if (rec != t->records.end() && (!oldest || waited(job, r, *rec) > waited(job, oldest_rank, *oldest)))
      oldest = &*rec, oldest_rank = r;
  }
  std::string text = detail::concat("no rank waited on another in the ", dumped, " dump(s) of ", job.world,
                                    " ranks, and their common collectives agree");
  if (!oldest) return text + "; none had a collective in flight";
  return detail::concat(text, "; the oldest collective in flight, ", short_name(*oldest, group_of(job, oldest_rank, *oldest)), " on rank ",
                        oldest_rank, ", had waited ", fixed(waited(job, oldest_rank, *oldest), 3), " s");
}

std::vector<std::string> table(const Job& job) {
  std::vector<std::vector<std::string>> rows = {{"rank", "host", "dump", "issued", "last completed", "blocked on"}};
  for (int r = 0; r < job.world; ++r) {
    const RankTrace* t = job.ranks[size_t(r)];
    if (!t) {
      rows.push_back({std::to_string(r), "-", "no dump", "-", "-", "-"});
      continue;
    }
    std::string last = "-", open_text = "-";
    for (auto it = t->records.rbegin(); it != t->records.rend(); ++it)
      if (!open(*it)) {
        last = short_name(*it, group_of(job, r, *it));
        break;
      }
    if (const Record* rec = waiting_in(*t)) {
      open_text = detail::concat(short_name(*rec, group_of(job, r, *rec)), " ", comm::trace::state_name(State(rec->state)),
                                 State(rec->state) == State::waiting ? " for " : " after ", fixed(waited(job, r, *rec)), " s");
    }
    if (t->header.paused_ns >= kPausedNs)
      open_text = detail::concat(open_text == "-" ? "" : open_text + "; ", "did not run for ",
                                 fixed(seconds(t->header.paused_ns)), " s, until ", fixed(seconds(t->header.paused_ago_ns)),
                                 " s before its dump");
    std::string dump(comm::trace::reason_name(Reason(t->header.reason)));
    if (Reason(t->header.reason) == Reason::fatal_signal || Reason(t->header.reason) == Reason::terminated)
      dump += detail::concat(" (signal ", t->header.signal, ")");
    rows.push_back({std::to_string(r), t->header.host, dump, std::to_string(t->header.issued), last, open_text});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  std::vector<std::string> lines;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c)
      line += c + 1 < row.size() ? row[c] + std::string(width[c] + 2 - row[c].size(), ' ') : row[c];
    lines.push_back(line);
  }
  return lines;
}

}  // namespace

std::vector<RankTrace> read_trace_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw UsageError(detail::concat(dir, ": not a directory"));
  const std::regex name(R"(rank-[0-9]+\.trace)");
  std::vector<std::string> paths;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (std::regex_match(entry.path().filename().string(), name)) paths.push_back(entry.path().string());
  if (ec) fail(dir, ": cannot list (", ec.message(), ")");
  if (paths.empty()) throw UsageError(detail::concat(dir, ": holds no flight-recorder dumps (rank-NNNNN.trace)"));
  std::sort(paths.begin(), paths.end());
  std::vector<RankTrace> dumps;
  for (const std::string& p : paths) dumps.push_back(comm::trace::read_trace(p));
  return dumps;
}

TraceReport analyse_traces(const std::vector<RankTrace>& dumps) {
  ZS_CHECK(!dumps.empty(), "no dumps to analyse");
  const RankTrace* newest = &dumps.front();
  for (const RankTrace& t : dumps)
    if (t.header.dump_wall_ns > newest->header.dump_wall_ns) newest = &t;
  std::vector<const RankTrace*> mine;
  std::vector<std::string> others;
  for (const RankTrace& t : dumps) {
    if (t.header.job == newest->header.job) mine.push_back(&t);
    else others.push_back(fs::path(t.path).filename().string());
  }
  const Job job = line_up(mine);
  TraceReport report;
  if (const auto differ = disagreement(job)) {
    report.verdict = *differ;
  } else if (const auto halted = stopped_verdict(job)) {
    report.verdict = *halted;
  } else {
    const std::vector<Stall> found = stalls(job);
    if (!found.empty()) {
      report.verdict = stall_verdict(job, found.front());
    } else if (const auto ended = ended_verdict(job)) {
      report.verdict = *ended;
    } else {
      report.verdict = running_verdict(job);
    }
  }
  report.lines = table(job);
  if (!others.empty()) {
    std::string note = "note: left out " + std::to_string(others.size()) + " dump(s) of an older job:";
    for (const std::string& o : others) note += " " + o;
    report.lines.push_back(note);
  }
  return report;
}

}  // namespace zshard
