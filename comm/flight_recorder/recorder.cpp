#include "comm/flight_recorder/recorder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <thread>

#include <zshard/error.h>

#include "comm/backend_base.h"
#include "kernels/option_names.h"

namespace zshard::comm {

namespace {

using trace::Purpose;
using trace::Reason;
using trace::State;

// One collective. The ring is written by the thread that issues collectives and read by a dump, which
// may be a signal handler interrupting that thread or running beside it: `seq` is 0 while the slot is
// being rewritten, and a dump keeps only slots whose `seq` is the same before and after it copied them.
struct Slot {
  std::atomic<uint64_t> seq{0};
  uint64_t group_seq = 0;
  int64_t issued_ns = 0;
  std::atomic<int64_t> ended_ns{0};
  int32_t group = 0;
  Signature sig;
  std::atomic<uint8_t> state{0};
};

struct Group {
  char key[64] = {};
  char label[40] = {};
  int32_t size = 0, rank = 0;
  std::atomic<uint64_t> issued{0};
  uint32_t derived = 0;  // groups made from this one so far
  uint64_t key_hash = 0;
  uint64_t marked = 0;       // issued at the last mark_groups
  uint64_t fingerprint = 0;  // of the signatures since
};

constexpr uint64_t kFnvBasis = 1469598103934665603ull;

uint64_t fnv64(uint64_t hash, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
  return hash;
}

// Everything lives here, constant-initialised: recording never allocates, and a signal handler can read it
// at any time.
struct Recorder {
  std::atomic<uint64_t> issued{0};
  std::atomic<int> groups_used{0};
  Slot ring[kTraceRingCapacity];
  Group groups[kMaxTraceGroups];
  bool dumps = false;
  std::atomic<bool> dumping{false};
  std::atomic<bool> ended{false};  // a dump for the end of the job is written: later ones keep it
  char path[4096] = {};
  char temp[4096] = {};
  uint64_t job = 0;
  int32_t rank = 0, world = 1;
  char host[64] = {};
  // The ticker's: its latest note, and the longest gap between two notes and when it ended (all on the
  // monotonic clock). The longest stays: a rank woken from a stop runs on before it is dumped.
  std::atomic<int64_t> last_tick_ns{0};
  std::atomic<int64_t> pause_ns{0};
  std::atomic<int64_t> pause_end_ns{0};
};
constinit Recorder recorder;
struct sigaction previous_actions[NSIG];

thread_local Purpose current_purpose = Purpose::other;
thread_local int current_unit = -1;

int64_t clock_ns(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return int64_t(t.tv_sec) * 1000000000 + t.tv_nsec;
}

void copy_text(char* dst, size_t capacity, std::string_view text) {
  const size_t n = std::min(text.size(), capacity - 1);
  std::memcpy(dst, text.data(), n);
  dst[n] = '\0';
}

int new_group(std::string_view key, int size, int rank) {
  Recorder& r = recorder;
  const int index = r.groups_used.load(std::memory_order_relaxed);
  if (index >= kMaxTraceGroups) return -1;
  Group& g = r.groups[index];
  copy_text(g.key, sizeof g.key, key);
  g.size = size;
  g.rank = rank;
  g.key_hash = fnv64(kFnvBasis, g.key, std::strlen(g.key));
  g.fingerprint = kFnvBasis;
  r.groups_used.store(index + 1, std::memory_order_release);  // a dump sees the entry once it is whole
  return index;
}

// Copies slot `seq` into `out` unless it was overwritten or is being written.
bool read_slot(const Slot& s, uint64_t seq, trace::Record& out) {
  if (s.seq.load(std::memory_order_acquire) != seq) return false;
  out = trace::Record{};
  out.seq = seq;
  out.group_seq = s.group_seq;
  out.issued_ns = s.issued_ns;
  out.ended_ns = s.ended_ns.load(std::memory_order_relaxed);
  out.count = s.sig.count;
  out.group = s.group;
  out.unit = s.sig.unit;
  out.root = s.sig.root;
  out.op = s.sig.op;
  out.dtype = s.sig.dtype;
  out.reduce = s.sig.reduce;
  out.purpose = s.sig.purpose;
  out.state = s.state.load(std::memory_order_acquire);
  std::atomic_thread_fence(std::memory_order_acquire);
  return s.seq.load(std::memory_order_relaxed) == seq;
}

bool write_all(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= size_t(n);
  }
  return true;
}

// "zshard: rank R: cannot write the flight record PATH (errno E)", without stdio (async-signal-safe).
void report_dump_failure(int error) {
  char line[4200];
  size_t n = 0;
  const auto put = [&](const char* text) {
    for (; *text && n < sizeof line - 1; ++text) line[n++] = *text;
  };
  const auto put_int = [&](long v) {
    char digits[24];
    int d = 0;
    const bool negative = v < 0;
    unsigned long u = negative ? 0ul - (unsigned long)v : (unsigned long)v;
    do digits[d++] = char('0' + u % 10); while ((u /= 10) > 0);
    if (negative) put("-");
    while (d > 0 && n < sizeof line - 1) line[n++] = digits[--d];
  };
  put("zshard: rank ");
  put_int(recorder.rank);
  put(": cannot write the flight record ");
  put(recorder.path);
  put(" (errno ");
  put_int(error);
  put(")\n");
  write_all(STDERR_FILENO, line, n);
}

void on_dump_request(int) { dump_flight_record(Reason::request, SIGUSR1); }

// After the dump, what was there before: the previous handler, or the default action (re-raised once
// the handler returns, the signal being blocked until then).
void on_ending_signal(int sig, siginfo_t* info, void* context) {
  dump_flight_record(sig == SIGTERM ? Reason::terminated : Reason::fatal_signal, sig);
  const struct sigaction& before = previous_actions[sig];
  if (before.sa_flags & SA_SIGINFO) {
    if (before.sa_sigaction) before.sa_sigaction(sig, info, context);
    return;
  }
  if (before.sa_handler == SIG_IGN) return;
  if (before.sa_handler != SIG_DFL) {
    before.sa_handler(sig);
    return;
  }
  struct sigaction fallback{};
  fallback.sa_handler = SIG_DFL;
  sigemptyset(&fallback.sa_mask);
  sigaction(sig, &fallback, nullptr);
  raise(sig);
}

constexpr auto kTick = std::chrono::milliseconds(100);

void start_ticker() {
  recorder.last_tick_ns.store(clock_ns(CLOCK_MONOTONIC));
  std::thread([] {
    for (;;) {
      std::this_thread::sleep_for(kTick);
      const int64_t now = clock_ns(CLOCK_MONOTONIC);
      const int64_t gap = now - recorder.last_tick_ns.exchange(now, std::memory_order_relaxed);
      if (gap > recorder.pause_ns.load(std::memory_order_relaxed)) {
        recorder.pause_end_ns.store(now, std::memory_order_relaxed);
        recorder.pause_ns.store(gap, std::memory_order_relaxed);
      }
    }
  }).detach();
}

void install_signal_handlers() {
  struct sigaction request{};
  request.sa_handler = on_dump_request;
  sigemptyset(&request.sa_mask);
  request.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &request, nullptr);
  for (int sig : {SIGTERM, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) {
    struct sigaction ending{};
    ending.sa_sigaction = on_ending_signal;
    sigemptyset(&ending.sa_mask);
    ending.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(sig, &ending, &previous_actions[sig]);
  }
}

}  // namespace

CollectiveLabel::CollectiveLabel(Purpose purpose, int unit)
    : outer_purpose_(current_purpose), outer_unit_(current_unit) {
  current_purpose = purpose;
  current_unit = unit;
}

CollectiveLabel::~CollectiveLabel() {
  current_purpose = outer_purpose_;
  current_unit = outer_unit_;
}

void check_trace_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  // The dump's path is preformatted into a fixed buffer (Recorder::path) beside "/rank-NNNNN.trace.tmp".
  if (dir.size() > 4000) throw UsageError(detail::concat(option_name(Option::trace_dir), ": the path is too long (", dir.size(), " bytes)"));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    throw UsageError(detail::concat(option_name(Option::trace_dir), " ", dir, ": cannot create the directory (",
                                    ec ? ec.message() : "a file is in the way", ")"));
  // A file made and removed: the only sure test (root passes access(2) on a read-only directory).
  const std::string probe = (fs::path(dir) / (".probe." + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw UsageError(detail::concat(option_name(Option::trace_dir), " ", dir, ": cannot write in it (", std::strerror(errno), ")"));
  ::close(fd);
  ::unlink(probe.c_str());
}

void start_recording(Communicator& world, const std::string& dir) {
  // Rank 0's wall clock names the job: dumps of one job carry it alike, a directory's older dumps not.
  uint64_t job = uint64_t(clock_ns(CLOCK_REALTIME)) ^ (uint64_t(::getpid()) << 32);
  static_assert(sizeof job % 4 == 0, "the job id is broadcast as 32-bit words");
  world.broadcast(&job, sizeof job / 4, DType::i32, 0)->wait();
  auto* backend = dynamic_cast<Backend*>(&world);
  if (backend && backend->trace_group() < 0) backend->set_trace_group(new_group("world", world.size(), world.rank()));
  Recorder& r = recorder;
  r.job = job;
  if (dir.empty() || r.dumps) return;
  r.rank = world.rank();
  r.world = world.size();
  char name[32];
  std::snprintf(name, sizeof name, "/rank-%05d.trace", r.rank);
  copy_text(r.path, sizeof r.path, dir + name);  // check_trace_dir bounds the length
  copy_text(r.temp, sizeof r.temp, dir + name + ".tmp");
  ::gethostname(r.host, sizeof r.host - 1);
  r.dumps = true;
  install_signal_handlers();
  start_ticker();
}

int derive_group(const Communicator& parent, std::string_view how, int size, int rank) {
  const int p = trace_group_of(parent);
  if (p < 0) return -1;
  Group& g = recorder.groups[p];
  return new_group(detail::concat(g.key, ".", g.derived++, how), size, rank);
}

uint64_t record_issue(int group, Collective op, size_t count, DType dtype, int reduce, int root) {
  if (group < 0) return 0;
  Recorder& r = recorder;
  Group& g = r.groups[group];
  const uint64_t seq = r.issued.load(std::memory_order_relaxed) + 1;
  const uint64_t group_seq = g.issued.load(std::memory_order_relaxed) + 1;
  Slot& s = r.ring[seq % kTraceRingCapacity];
  s.seq.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  const Signature sig{count, current_unit, root, uint8_t(op), uint8_t(dtype),
                      reduce < 0 ? trace::kNoReduce : uint8_t(reduce), uint8_t(current_purpose)};
  s.group_seq = group_seq;
  s.issued_ns = clock_ns(CLOCK_MONOTONIC);
  s.group = group;
  s.sig = sig;
  s.ended_ns.store(0, std::memory_order_relaxed);
  s.state.store(uint8_t(State::in_flight), std::memory_order_relaxed);
  s.seq.store(seq, std::memory_order_release);
  r.issued.store(seq, std::memory_order_release);
  g.issued.store(group_seq, std::memory_order_release);
  g.fingerprint = fnv64(g.fingerprint, &sig, sizeof sig);
  return seq;
}

namespace {
// Slot `id` while its collective has not ended, else null (ended, or overwritten by a newer one).
Slot* unended(uint64_t id) {
  if (id == 0) return nullptr;
  Slot& s = recorder.ring[id % kTraceRingCapacity];
  const auto state = State(s.state.load(std::memory_order_relaxed));
  if (s.seq.load(std::memory_order_acquire) != id || (state != State::in_flight && state != State::waiting))
    return nullptr;
  return &s;
}
}  // namespace

void record_waiting(uint64_t id) {
  if (Slot* s = unended(id)) s->state.store(uint8_t(State::waiting), std::memory_order_release);
}

void record_end(uint64_t id, State state) {
  Slot* s = unended(id);
  if (!s) return;
  s->ended_ns.store(clock_ns(CLOCK_MONOTONIC), std::memory_order_relaxed);
  s->state.store(uint8_t(state), std::memory_order_release);
}

void set_group_label(const Communicator& comm, std::string_view label) {
  if (const int g = trace_group_of(comm); g >= 0) copy_text(recorder.groups[g].label, sizeof Group::label, label);
}

void dump_flight_record(Reason reason, int signal) {
  Recorder& r = recorder;
  if (!r.dumps) return;
  struct KeepErrno {  // for the signal handlers that call this
    int saved = errno;
    ~KeepErrno() { errno = saved; }
  } keep_errno;
  bool idle = false;
  if (!r.dumping.compare_exchange_strong(idle, true)) return;
  // The first dump for the end of the job stays (a rank that timed out, then got mpirun's SIGTERM).
  if (reason != Reason::request && r.ended.exchange(true)) {
    r.dumping.store(false);
    return;
  }
  const int fd = ::open(r.temp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    report_dump_failure(errno);
    r.dumping.store(false);
    return;
  }
  trace::FileHeader h{};
  std::memcpy(h.magic, trace::kMagic, sizeof h.magic);
  h.version = trace::kVersion;
  h.header_bytes = sizeof h;
  h.job = r.job;
  h.rank = r.rank;
  h.world_size = r.world;
  h.pid = int32_t(::getpid());
  h.signal = signal;
  h.reason = uint8_t(reason);
  h.dump_steady_ns = clock_ns(CLOCK_MONOTONIC);
  h.dump_wall_ns = clock_ns(CLOCK_REALTIME);
  h.issued = r.issued.load(std::memory_order_acquire);
  h.ring_capacity = kTraceRingCapacity;
  h.group_count = uint32_t(r.groups_used.load(std::memory_order_acquire));
  h.group_bytes = sizeof(trace::GroupEntry);
  h.record_bytes = sizeof(trace::Record);
  std::memcpy(h.host, r.host, sizeof h.host);
  // A dump that runs before the ticker woke (a handler of the signal that resumed the process) sees the
  // pause still going.
  const int64_t since_tick = h.dump_steady_ns - r.last_tick_ns.load(std::memory_order_relaxed);
  h.paused_ns = r.pause_ns.load(std::memory_order_relaxed);
  h.paused_ago_ns = h.dump_steady_ns - r.pause_end_ns.load(std::memory_order_relaxed);
  if (since_tick > h.paused_ns) h.paused_ns = since_tick, h.paused_ago_ns = 0;
  // The header goes first as a placeholder and again once the records are counted.
  bool ok = write_all(fd, &h, sizeof h);
  for (uint32_t i = 0; i < h.group_count; ++i) {
    const Group& g = r.groups[i];
    trace::GroupEntry e{};
    std::memcpy(e.key, g.key, sizeof e.key);
    std::memcpy(e.label, g.label, sizeof e.label);
    e.issued = g.issued.load(std::memory_order_acquire);
    e.size = g.size;
    e.rank = g.rank;
    trace::seal(e);
    ok = ok && write_all(fd, &e, sizeof e);
  }
  constexpr int kBatch = 32;
  trace::Record batch[kBatch];
  int pending = 0;
  const uint64_t first = h.issued > uint64_t(kTraceRingCapacity) ? h.issued - kTraceRingCapacity + 1 : 1;
  for (uint64_t seq = first; seq <= h.issued; ++seq) {
    if (!read_slot(r.ring[seq % kTraceRingCapacity], seq, batch[pending])) continue;
    trace::seal(batch[pending]);
    ++h.record_count;
    if (++pending == kBatch) {
      ok = ok && write_all(fd, batch, sizeof batch);
      pending = 0;
    }
  }
  ok = ok && write_all(fd, batch, size_t(pending) * sizeof(trace::Record));
  trace::seal(h);
  ok = ok && ::lseek(fd, 0, SEEK_SET) == 0 && write_all(fd, &h, sizeof h);
  const int write_error = ok ? 0 : errno;
  ok = ::close(fd) == 0 && ok;
  if (ok && ::rename(r.temp, r.path) == 0) {
    r.dumping.store(false);
    return;
  }
  report_dump_failure(write_error ? write_error : errno);
  ::unlink(r.temp);
  r.dumping.store(false);
}

std::vector<GroupProgress> group_progress(int except) {
  std::vector<GroupProgress> out;
  const int n = recorder.groups_used.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    if (i == except) continue;
    const Group& g = recorder.groups[i];
    out.push_back({i, g.key_hash, g.label[0] ? g.label : g.key, g.marked, g.issued.load(), g.fingerprint});
  }
  return out;
}

uint64_t signatures_since_mark(int group, std::vector<Signature>& out) {
  out.clear();
  const Group& g = recorder.groups[group];
  const uint64_t last = recorder.issued.load();
  const uint64_t first = last > uint64_t(kTraceRingCapacity) ? last - kTraceRingCapacity + 1 : 1;
  uint64_t first_group_seq = g.issued.load() + 1;
  trace::Record rec;
  for (uint64_t seq = first; seq <= last; ++seq) {
    if (!read_slot(recorder.ring[seq % kTraceRingCapacity], seq, rec) || rec.group != group || rec.group_seq <= g.marked)
      continue;
    if (out.empty()) first_group_seq = rec.group_seq;
    out.push_back(signature_of(rec));
  }
  return first_group_seq;
}

void mark_groups() {
  const int n = recorder.groups_used.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    Group& g = recorder.groups[i];
    g.marked = g.issued.load();
    g.fingerprint = kFnvBasis;
  }
}


}  // namespace zshard::comm
