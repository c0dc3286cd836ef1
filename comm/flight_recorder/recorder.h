// The flight recorder: each rank keeps a ring of its last collectives (sequence numbers, op, group, count,
// the engine's label, issue and completion times, state) and writes it to --trace-dir when the job fails
// (a deadline or any other error that aborts it, a fatal signal, the SIGTERM with which mpirun ends the
// other ranks) or on SIGUSR1, and goes on after SIGUSR1. zshard-trace lines the ranks' dumps up.
//
// Every backend records through it: a communicator is recorded once it has a group here (trace_group()
// >= 0), which the world gets from start_recording and every communicator split or derived from a
// recorded one gets from derive_group. A group's key is the same on all its members (the parent's key, the
// split's index and the color), so the dumps of different ranks name their common collectives by (key,
// number in the group).
//
// Cost: a collective writes one slot of a fixed ring (no allocation, no lock: collectives are issued by
// one thread) and reads the clock at issue and at completion. Nothing is recorded until recording
// starts. The dump itself is async-signal-safe (open, write, rename of a preformatted path).
//
// A stopped rank (SIGSTOP, a debugger) or one starved of CPU leaves the others waiting without being in
// any wait itself: a thread of the recorder notes the time every 100 ms, and the dump reports the
// longest gap between its notes and how long ago it ended (FileHeader::paused_ns).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <zshard/communicator.h>

#include "comm/flight_recorder/dump_file.h"

namespace zshard::comm {

// The collectives this thread issues while a label lives carry its purpose and unit (nested labels
// restore the outer one). How the engine says what it gathers or reduces, for the dumps and the check.
class CollectiveLabel {
 public:
  explicit CollectiveLabel(trace::Purpose purpose, int unit = -1);
  ~CollectiveLabel();
  CollectiveLabel(const CollectiveLabel&) = delete;
  CollectiveLabel& operator=(const CollectiveLabel&) = delete;

 private:
  trace::Purpose outer_purpose_;
  int outer_unit_;
};

inline constexpr int kTraceRingCapacity = 4096;  // collectives kept per rank (a power of two)
inline constexpr int kMaxTraceGroups = 128;      // communicators recorded per process; later ones are not

// Throws UsageError naming --trace-dir when `dir` cannot be created or written (creates it).
void check_trace_dir(const std::string& dir);
// Starts recording `world` (a no-op when it already is) and, with a `dir`, dumping this rank's ring to
// dir/rank-NNNNN.trace on the events above; installs the signal handlers then. Collective over `world`
// (rank 0's job id is broadcast). The check of `dir` (check_trace_dir) must have passed on every rank.
void start_recording(Communicator& world, const std::string& dir);

// For the backends. A communicator made from `parent` (a split, or another backend's communicator over
// the same ranks): its group, keyed by the parent's key, the parent's count of derived groups and `how`
// (":COLOR" for a split); -1 when the parent is not recorded or the groups are full.
int derive_group(const Communicator& parent, std::string_view how, int size, int rank);
// Records a collective issued on `group` (a no-op returning 0 for -1); `reduce` and `root` are -1 where
// they do not apply. Returns the id record_end takes.
uint64_t record_issue(int group, Collective op, size_t count, DType dtype, int reduce, int root);
// This rank blocks on collective `id` until it ends (a wait, or on a device the stream's wait).
void record_waiting(uint64_t id);
// The collective `id` completed (or timed out, or failed); the first end recorded stays.
void record_end(uint64_t id, trace::State state);
// The engine's name for a communicator's group, shown in the dumps ("shard group 1").
void set_group_label(const Communicator& comm, std::string_view label);

// Writes this rank's ring (a no-op without a trace dir, or while another dump runs). Async-signal-safe.
void dump_flight_record(trace::Reason reason, int signal = 0);

// What --check-collectives compares (comm/collective_check.h): each recorded group's collectives since
// the last mark, hashed, with the signatures (comm/flight_recorder/dump_file.h) the ring still holds.
struct GroupProgress {
  int group;
  uint64_t key_hash;
  std::string label;  // the label, else the key
  uint64_t marked;    // collectives of the group before the mark
  uint64_t issued;    // collectives of the group so far
  uint64_t fingerprint;  // hash of the signatures since the mark
};
// The groups that take part in the comparison (every recorded group but `except`).
std::vector<GroupProgress> group_progress(int except);
// Signatures of `group`'s collectives numbered (marked, issued], as far as the ring still holds them:
// returns the number of the first one given.
uint64_t signatures_since_mark(int group, std::vector<Signature>& out);
void mark_groups();

}  // namespace zshard::comm
