// The flight recorder's dump file: one per rank, DIR/rank-NNNNN.trace, written by the rank itself on a
// failure or on request (comm/flight_recorder/recorder.h) and read by zshard-trace.
//
//   FileHeader                 magic, version, who and when, the counts of what follows
//   GroupEntry x group_count   the communicators the records name, by index
//   Record x record_count      the ring's collectives, oldest first
//
// Fixed-size, native little-endian records, so that a signal handler can write them with write(2) and no
// allocation. Each part ends with a checksum of its other bytes, and the file's size must be exactly what
// the header counts: a reader refuses a corrupt or truncated file in one line naming the part.
//
// Also here: a collective's Signature and how the text of zshard-trace and --check-collectives names it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <zshard/communicator.h>

namespace zshard::comm::trace {

inline constexpr char kMagic[8] = {'Z', 'S', 'H', 'T', 'R', 'A', 'C', 'E'};
inline constexpr uint32_t kVersion = 1;

// Where a collective stands when the ring is dumped: issued and in flight (its rank may be computing
// meanwhile), waited for (its rank blocked on it), or ended.
enum class State : uint8_t { in_flight = 1, completed = 2, timed_out = 3, failed = 4, waiting = 5 };
// Why the rank wrote its dump.
enum class Reason : uint8_t { request = 1, abort = 2, fatal_signal = 3, terminated = 4 };
// What the engine issued a collective for (comm::CollectiveLabel); other: not labelled.
enum class Purpose : uint8_t {
  other = 0, params = 1, grads = 2, grads_across = 3, grad_norm = 4, check = 5, step_tokens = 6, step_loss = 7
};
inline constexpr uint8_t kNoReduce = 0xff;  // Record::reduce of the collectives that do not reduce

struct FileHeader {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;
  uint64_t job;  // the same on every rank of one job (rank 0's, broadcast when recording starts)
  int32_t rank, world_size, pid;
  int32_t signal;  // the signal that made the dump (0: none)
  uint8_t reason;  // Reason
  uint8_t pad0[7];
  int64_t dump_steady_ns;  // this host's monotonic clock, as the records' times
  int64_t dump_wall_ns;    // the wall clock at the dump (ranks on different hosts compare these roughly)
  uint64_t issued;         // collectives this rank issued in all, over every group
  // The longest time the process did not run since recording started (SIGSTOP, a debugger, starved of
  // CPU), and how long before the dump that pause ended (0: it lasted until the dump).
  int64_t paused_ns;
  int64_t paused_ago_ns;
  uint32_t ring_capacity;
  uint32_t group_count, record_count;
  uint32_t group_bytes, record_bytes;
  char host[64];
  uint8_t pad1[80];
  uint32_t checksum;
};

struct GroupEntry {
  char key[64];    // the same on every member: "world", then one part per split ("world.0:1")
  char label[40];  // what the engine calls it ("shard group 1"); may be empty
  uint64_t issued;  // collectives this rank issued on it
  int32_t size, rank;  // the group's size and this rank's place in it
  uint8_t pad[4];
  uint32_t checksum;
};

struct Record {
  uint64_t seq;        // this rank's collective number over all its groups, from 1
  uint64_t group_seq;  // its number in its group, from 1: the same on every member
  int64_t issued_ns;   // monotonic clock of this host
  int64_t ended_ns;    // when it completed, timed out or failed; 0 while in flight
  uint64_t count;      // elements per rank, as the Communicator call took it
  int32_t unit;        // the model unit it was issued for, -1: none
  int32_t root;        // broadcast's root, -1 otherwise
  int32_t group;       // index into the group entries
  uint8_t op;          // Collective
  uint8_t dtype;       // DType
  uint8_t reduce;      // ReduceOp, or kNoReduce
  uint8_t purpose;     // Purpose
  uint8_t state;       // State
  uint8_t pad[3];
  uint32_t checksum;
};

static_assert(sizeof(FileHeader) == 256 && sizeof(GroupEntry) == 128 && sizeof(Record) == 64,
              "the trace format's parts have fixed sizes");

// FNV-1a over `bytes`: the parts' checksums. Async-signal-safe.
uint32_t checksum(const void* data, size_t bytes);
// Sets a part's checksum field (its last four bytes) from the bytes before it. Async-signal-safe.
template <class Part>
void seal(Part& part) {
  part.checksum = checksum(&part, sizeof(Part) - sizeof(part.checksum));
}

std::string_view state_name(State s);
std::string_view purpose_name(Purpose p);
std::string_view reason_name(Reason r);

// A dump as read back, checked.
struct RankTrace {
  std::string path;
  FileHeader header;
  std::vector<GroupEntry> groups;
  std::vector<Record> records;  // oldest first
};

// Reads and checks one dump. Throws zshard::Error naming the file and what is wrong with it: not a trace,
// another version, truncated or too long, a part that fails its checksum or holds impossible values; and
// UsageError, before opening it, for a path that is not a regular file (a FIFO, a device, a directory).
RankTrace read_trace(const std::string& path);

}  // namespace zshard::comm::trace

namespace zshard::comm {

// What a collective is, apart from when and on which group: what the ranks of a group must agree on.
struct Signature {
  uint64_t count = 0;
  int32_t unit = -1, root = -1;
  uint8_t op = 0, dtype = 0, reduce = trace::kNoReduce, purpose = 0;
  uint8_t pad[4] = {};
  bool operator==(const Signature&) const = default;
};

std::string describe(const Signature& s);  // "all_gather of 1536 f32 (params, unit 3)"
Signature signature_of(const trace::Record& r);
// How a group's members part at one collective, given each member's signature there (none: it issued
// nothing there): "rank 1 issued X; ranks 0, 2 issued Y", the side of the most ranks last; empty where
// they agree. A rank whose signature is the most ranks' next one (`next`, where given) skipped theirs.
std::string describe_parting(const std::vector<std::pair<int, std::optional<Signature>>>& members,
                             const std::function<std::optional<Signature>(int rank)>& next = {});

}  // namespace zshard::comm
