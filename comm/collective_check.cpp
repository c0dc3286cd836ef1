#include "comm/collective_check.h"

#include <algorithm>
#include <cerrno>  // program_invocation_short_name
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "comm/agreed_failure.h"
#include "comm/backend_base.h"
#include "comm/flight_recorder/recorder.h"
#include "comm/abort.h"
#include "comm/rank_list.h"

namespace zshard::comm {

namespace {

constexpr int kMaxComparedGroups = 64;
// How long a rank whose failure is another rank's consequence waits for that rank to end the job.
constexpr auto kQuietWait = std::chrono::seconds(10);
// Beyond a collective's deadline, how long a peer may take to unwind from it into the comparison: a loaded
// host deschedules a rank for a second or more.
constexpr auto kUnwindMargin = std::chrono::seconds(3);

// What a rank sends first: per group, its collectives since the last boundary, counted and hashed.
struct Summary {
  struct Entry {
    uint64_t key_hash, count, fingerprint;
  };
  uint64_t own_failure = 0;  // unwinding from an error of its own, with none of its collectives failed
  uint64_t groups = 0;
  Entry group[kMaxComparedGroups] = {};
};

// Then, where a group's members differ, each member's signatures of that group since the boundary.
struct Detail {
  uint64_t first = 0;  // group number of signature 0
  uint64_t given = 0;  // signatures that follow (the ring may have lost the oldest)
  uint64_t last = 0;   // the group's last collective on this rank
  char label[40] = {};
};

// Every rank's `bytes` bytes (the same count everywhere), as 16-bit words: every dtype moves.
std::vector<char> gather_bytes(Communicator& comm, const void* mine, size_t bytes, Clock::time_point deadline) {
  static_assert(sizeof(Summary) % 2 == 0 && sizeof(Detail) % 2 == 0 && sizeof(Signature) % 2 == 0);
  std::vector<char> all(bytes * size_t(comm.size()));
  comm.all_gather(mine, all.data(), bytes / 2, DType::u16)->wait(deadline);
  return all;
}

Clock::time_point after(Clock::duration wait) {
  const auto now = Clock::now();
  return wait >= Clock::time_point::max() - now ? Clock::time_point::max() : now + wait;
}

// The first collective at which the members' signatures part, and both sides. `sigs[m]` holds member m's
// signatures numbered from `details[m].first`.
std::string first_divergence(const std::string& label, const std::vector<int>& members,
                             const std::vector<Detail>& details, const std::vector<std::vector<Signature>>& sigs) {
  uint64_t from = 0, to = 0;
  for (const Detail& d : details) {
    from = std::max(from, d.first);
    to = std::max(to, d.last);
  }
  // Member m's signature of collective i, or nothing where it issued fewer.
  const auto at = [&](size_t m, uint64_t i) -> std::optional<Signature> {
    if (i > details[m].last || i < details[m].first || i - details[m].first >= sigs[m].size()) return std::nullopt;
    return sigs[m][size_t(i - details[m].first)];
  };
  const std::string group = detail::concat(label, " (", rank_list(members), ")");
  for (uint64_t i = from; i <= to; ++i) {
    std::vector<std::pair<int, std::optional<Signature>>> at_i;
    for (size_t m = 0; m < members.size(); ++m) at_i.push_back({members[m], at(m, i)});
    const std::string parting = describe_parting(at_i, [&](int rank) {
      return at(size_t(std::find(members.begin(), members.end(), rank) - members.begin()), i + 1);
    });
    if (!parting.empty()) return detail::concat(group, " parts at its collective #", i, ": ", parting);
  }
  return group + " differ only in collectives older than the flight recorder holds";
}

}  // namespace

CollectiveCheck::CollectiveCheck(Communicator& world) : world_(world), comm_(world.split(0, world.rank())) {
  set_group_label(*comm_, "collective check");
}

CollectiveCheck::~CollectiveCheck() {
  // Unwinding from a failure of this step (a collective timed out or failed, or the run threw): compare
  // before the job is aborted, so that a divergence is named rather than its symptom.
  if (std::uncaught_exceptions() == 0 || !usable_) return;
  usable_ = false;
  // A rank that threw with none of its collectives failed (an error of its own, out of memory) is the
  // cause: its peers, left waiting in the collective it never issued, part from it there, and that
  // parting is no divergence.
  const bool own_failure = !collectives_failed();
  Comparison found;
  try {
    found = exchange(true, own_failure, after(world_.timeout() + kUnwindMargin));
  } catch (const std::exception&) {
    return;  // not every rank answered within the deadline: the failure on its way up is all there is to say
  }
  if (found.own_failure) {
    if (own_failure) return;  // its line ends the job (run_tool)
    // This rank's timeout is that failure's consequence: its line would stand beside the cause's, or
    // before it. The failing rank ends the job; this rank ends it too should that not come.
    std::this_thread::sleep_for(kQuietWait);
    abort_world(1);
  }
  if (found.divergence.empty()) return;
  // The divergence is the cause; each rank's own failure is its consequence, left unsaid.
  if (world_.rank() == 0) std::fprintf(stderr, "%s: error: %s\n", program_invocation_short_name, found.divergence.c_str());
  abort_world(1);
}

void CollectiveCheck::compare(int step) {
  usable_ = false;
  // Twice the deadline: a peer stuck in a collective of the step reaches the comparison from its
  // unwinding once its own deadline has passed (see the header).
  const std::string divergence =
      exchange(false, false, after(2 * world_.timeout() + kUnwindMargin)).divergence;
  steps_compared_ = step;
  if (!divergence.empty()) throw AgreedFailure(divergence, 1, world_.rank() == 0);
  usable_ = true;
}

CollectiveCheck::Comparison CollectiveCheck::exchange(bool failed, bool own_failure, Clock::time_point deadline) {
  const CollectiveLabel label(trace::Purpose::check);
  const int ranks = comm_->size();
  Summary mine;
  mine.own_failure = own_failure;
  std::vector<GroupProgress> progress = group_progress(trace_group_of(*comm_));
  progress.resize(std::min<size_t>(progress.size(), kMaxComparedGroups));
  mine.groups = progress.size();
  for (size_t g = 0; g < progress.size(); ++g)
    mine.group[g] = {progress[g].key_hash, progress[g].issued - progress[g].marked, progress[g].fingerprint};
  const std::vector<char> raw = gather_bytes(*comm_, &mine, sizeof mine, deadline);
  std::vector<Summary> all(static_cast<size_t>(ranks));
  std::memcpy(all.data(), raw.data(), raw.size());
  if (std::any_of(all.begin(), all.end(), [](const Summary& r) { return r.own_failure != 0; }))
    return {"", true};

  // The first group, in rank and then creation order, whose members disagree.
  std::map<uint64_t, std::vector<std::pair<int, Summary::Entry>>> by_key;
  std::vector<uint64_t> keys;
  for (int r = 0; r < ranks; ++r)
    for (uint64_t g = 0; g < all[size_t(r)].groups; ++g) {
      const Summary::Entry& e = all[size_t(r)].group[g];
      if (!by_key.count(e.key_hash)) keys.push_back(e.key_hash);
      by_key[e.key_hash].push_back({r, e});
    }
  uint64_t divergent = 0;
  bool found = false;
  for (uint64_t key : keys) {
    const auto& entries = by_key[key];
    for (const auto& [r, e] : entries)
      found = found || e.count != entries[0].second.count || e.fingerprint != entries[0].second.fingerprint;
    if (found) {
      divergent = key;
      break;
    }
  }
  const std::string step = detail::concat("collective check, step ", steps_compared_ + 1,
                                          failed ? " (a collective of this step failed)" : "", ": ");
  if (!found) {
    mark_groups();
    return {};
  }

  uint64_t most = 0;
  std::vector<int> members;
  for (const auto& [r, e] : by_key[divergent]) {
    most = std::max(most, e.count);
    members.push_back(r);
  }
  most = std::min<uint64_t>(most, kTraceRingCapacity);
  std::vector<char> payload(sizeof(Detail) + most * sizeof(Signature), 0);
  const auto local = std::find_if(progress.begin(), progress.end(), [&](const GroupProgress& p) { return p.key_hash == divergent; });
  if (local != progress.end()) {
    std::vector<Signature> sigs;
    Detail d;
    d.first = signatures_since_mark(local->group, sigs);
    sigs.resize(std::min<size_t>(sigs.size(), most));
    d.given = sigs.size();
    d.last = local->issued;
    std::strncpy(d.label, local->label.c_str(), sizeof d.label - 1);
    std::memcpy(payload.data(), &d, sizeof d);
    std::memcpy(payload.data() + sizeof d, sigs.data(), sigs.size() * sizeof(Signature));
  }
  const std::vector<char> details_raw = gather_bytes(*comm_, payload.data(), payload.size(), deadline);
  std::vector<Detail> details;
  std::vector<std::vector<Signature>> sigs;
  for (int r : members) {
    const char* p = details_raw.data() + size_t(r) * payload.size();
    Detail d;
    std::memcpy(&d, p, sizeof d);
    std::vector<Signature> s(size_t(d.given));
    std::memcpy(s.data(), p + sizeof d, s.size() * sizeof(Signature));
    details.push_back(d);
    sigs.push_back(std::move(s));
  }
  return {step + first_divergence(details[0].label, members, details, sigs), false};
}

}  // namespace zshard::comm
