// zshard-commbench: all_gather, reduce_scatter, all_reduce and all_to_all through zshard's communicator over
// a size sweep, in the conventions of nccl-tests: size is the full buffer (all ranks' blocks), time the mean
// over ranks of one call, algbw = size / time, busbw = algbw * 2(n-1)/n for all_reduce and (n-1)/n for
// all_gather, reduce_scatter and all_to_all (what quantized reductions exchange). Every size is checked
// element by element. On the MPI backend a raw MPI column (the blocking collective) and a raw non-blocking
// one (the MPI_I* call, then MPI_Wait) run interleaved with zshard's: zshard issues MPI_I* for its gathers
// and all-to-alls, so there a gap is zshard's overhead; its reductions are its own rings
// (comm/ring_reduction.h), measured against MPI's algorithms.
#include <algorithm>
#include <climits>
#include <cmath>
#include <iomanip>
#include <iostream>

#include <nlohmann/json.hpp>

#include "comm/agreed_failure.h"
#include "comm/launch.h"
#include "comm/mpi_communicator.h"
#include "comm/polling_work.h"
#include "kernels/allocator.h"
#include "kernels/device_memory.h"
#include "kernels/io/atomic_file.h"
#include "runtime/cli/memory_flags.h"
#include "runtime/cli/path_checks.h"
#include "shard/memory/fit_check.h"
#include "shard/memory/estimator.h"
#include "runtime/tools/tool_runner.h"
#include "runtime/cli/flags.h"

using namespace zshard;
using comm::Collective;
using nlohmann::json;

namespace {

struct SweepOptions {
  std::string min_size = "8";
  std::string max_size = "256MiB";
  int factor = 2;
  int rounds = 3;                    // interleaved zshard / raw rounds per size; the median is reported
  double round_ms = 50;              // calls per round: about this long, at least 2
  std::vector<std::string> ops{"all_gather", "reduce_scatter", "all_reduce"};
  std::string json_path;
};

double bus_factor(Collective c, int n) { return (c == Collective::all_reduce ? 2.0 : 1.0) * (n - 1) / n; }

// The value rank `r` puts at global element `i` of its input, and what a correct result holds:
// small integers times a pattern, exact in float after summing over ranks.
float pattern(int64_t i) { return float(i % 13 + 1); }
float input(int r, int64_t i) { return float(r + 1) * pattern(i); }

// One collective with fixed buffers, issued either through zshard or as raw MPI.
class Case {
 public:
  Case(comm::Communicator& world, Collective op, int64_t elems)
      : world_(world), op_(op), n_(world.size()), elems_(elems),
        send_(size_t(elems) * 4, world.device(), Category::comm),
        recv_(size_t(elems) * 4, world.device(), Category::comm) {}

  int64_t elems() const { return elems_; }
  int64_t bytes() const { return elems_ * 4; }

  void zshard_call() {
    const size_t block = size_t(elems_ / n_);
    switch (op_) {
      case Collective::all_gather: world_.all_gather(send_.data(), recv_.data(), block, DType::f32)->wait(); break;
      case Collective::reduce_scatter:
        world_.reduce_scatter(send_.data(), recv_.data(), block, DType::f32, comm::ReduceOp::sum)->wait();
        break;
      case Collective::all_to_all: world_.all_to_all(send_.data(), recv_.data(), block, DType::f32)->wait(); break;
      default: world_.all_reduce(recv_.data(), size_t(elems_), DType::f32, comm::ReduceOp::sum)->wait(); break;
    }
  }

  // Raw MPI: the blocking collective, or (nonblocking) the MPI_I* form zshard issues, then MPI_Wait.
  void raw_call(MPI_Comm c, bool nonblocking = false) {
    const int block = int(elems_ / n_);
    MPI_Request req;
    switch (op_) {
      case Collective::all_gather:
        ZS_MPI_CHECK(nonblocking ? MPI_Iallgather(send_.data(), block, MPI_FLOAT, recv_.data(), block, MPI_FLOAT, c, &req)
                                 : MPI_Allgather(send_.data(), block, MPI_FLOAT, recv_.data(), block, MPI_FLOAT, c));
        break;
      case Collective::reduce_scatter:
        ZS_MPI_CHECK(nonblocking
                         ? MPI_Ireduce_scatter_block(send_.data(), recv_.data(), block, MPI_FLOAT, MPI_SUM, c, &req)
                         : MPI_Reduce_scatter_block(send_.data(), recv_.data(), block, MPI_FLOAT, MPI_SUM, c));
        break;
      case Collective::all_to_all:
        ZS_MPI_CHECK(nonblocking ? MPI_Ialltoall(send_.data(), block, MPI_FLOAT, recv_.data(), block, MPI_FLOAT, c, &req)
                                 : MPI_Alltoall(send_.data(), block, MPI_FLOAT, recv_.data(), block, MPI_FLOAT, c));
        break;
      default:
        ZS_MPI_CHECK(nonblocking ? MPI_Iallreduce(MPI_IN_PLACE, recv_.data(), int(elems_), MPI_FLOAT, MPI_SUM, c, &req)
                                 : MPI_Allreduce(MPI_IN_PLACE, recv_.data(), int(elems_), MPI_FLOAT, MPI_SUM, c));
        break;
    }
    if (nonblocking) ZS_MPI_CHECK(MPI_Wait(&req, MPI_STATUS_IGNORE));
  }

  // Fills the inputs with the pattern, runs `call` once and counts wrong elements of this rank's result.
  template <class Call>
  int64_t check(Call&& call) {
    const int r = world_.rank();
    const int64_t block = elems_ / n_;
    std::vector<float> host(static_cast<size_t>(elems_));
    if (op_ == Collective::all_gather) {
      for (int64_t j = 0; j < block; ++j) host[size_t(j)] = input(r, j);
      copy_bytes(send_.data(), world_.device(), host.data(), Device::cpu, size_t(block) * 4);
    } else {
      for (int64_t i = 0; i < elems_; ++i) host[size_t(i)] = input(r, i);
      const bool in_send = op_ == Collective::reduce_scatter || op_ == Collective::all_to_all;
      copy_bytes(in_send ? send_.data() : recv_.data(), world_.device(), host.data(), Device::cpu, size_t(elems_) * 4);
    }
    call();
    const int64_t out = op_ == Collective::reduce_scatter ? block : elems_;
    copy_bytes(host.data(), Device::cpu, recv_.data(), world_.device(), size_t(out) * 4);
    const float ranks_sum = float(n_) * float(n_ + 1) / 2;
    int64_t wrong = 0;
    for (int64_t i = 0; i < out; ++i) {
      float want = 0;
      switch (op_) {
        case Collective::all_gather: want = input(int(i / block), i % block); break;
        case Collective::reduce_scatter: want = ranks_sum * pattern(r * block + i); break;
        // Block s of the result is rank s's block r: its input at r * block onwards.
        case Collective::all_to_all: want = input(int(i / block), r * block + i % block); break;
        default: want = ranks_sum * pattern(i); break;
      }
      wrong += host[size_t(i)] != want;
    }
    zero();
    return wrong;
  }

  // Timing runs on zeros so that repeated in-place sums stay finite.
  void zero() {
    std::vector<float> zeros(size_t(elems_), 0.0f);
    copy_bytes(send_.data(), world_.device(), zeros.data(), Device::cpu, send_.bytes());
    copy_bytes(recv_.data(), world_.device(), zeros.data(), Device::cpu, recv_.bytes());
  }

 private:
  comm::Communicator& world_;
  Collective op_;
  int n_;
  int64_t elems_;
  Buffer send_, recv_;
};

// Mean seconds per call over `iters` calls, averaged over ranks (nccl-tests).
template <class Call>
double time_calls(comm::Communicator& world, int iters, Call&& call) {
  world.barrier();
  const auto t0 = comm::Clock::now();
  for (int i = 0; i < iters; ++i) call();
  double s = std::chrono::duration<double>(comm::Clock::now() - t0).count() / iters;
  comm::all_reduce_sum(world, &s, 1);
  return s / world.size();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// The Iallreduce algorithm Open MPI's libnbc will use in the raw non-blocking column (the MCA variable
// coll_libnbc_iallreduce_algorithm, read through the MPI tool interface): "default" (libnbc's choice by
// size) unless the user set it; "" where the MPI has no such variable (not Open MPI) or does not expose it.
std::string libnbc_iallreduce_algorithm() {
  int provided = 0;
  if (MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS) return "";
  std::string name;
  int index = -1;
  if (MPI_T_cvar_get_index("coll_libnbc_iallreduce_algorithm", &index) == MPI_SUCCESS) {
    MPI_T_cvar_handle handle;
    int count = 0, value = -1;
    if (MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
      if (count == 1 && MPI_T_cvar_read(handle, &value) == MPI_SUCCESS) {
        // Open MPI 4.x: 0 ignore (libnbc's own choice by size), 1 ring, 2 binomial, 3 rabenseifner,
        // 4 recursive doubling.
        const char* names[] = {"default", "ring", "binomial", "rabenseifner", "recursive_doubling"};
        name = value >= 0 && value < 5 ? names[value] : std::to_string(value);
      }
      MPI_T_cvar_handle_free(&handle);
    }
  }
  MPI_T_finalize();
  return name;
}

Collective parse_op(const std::string& name) {
  for (Collective c : {Collective::all_gather, Collective::reduce_scatter, Collective::all_reduce, Collective::all_to_all})
    if (comm::collective_name(c) == name) return c;
  throw UsageError("--ops: unknown collective '" + name + "' (all_gather, reduce_scatter, all_reduce, all_to_all)");
}

}  // namespace

int main(int argc, char** argv) {
  SweepOptions o;
  CLI::App app{"zshard-commbench: collective bandwidth through zshard's communicator (nccl-tests conventions)"};
  app.option_defaults()->always_capture_default();
  app.add_option("--min-size", o.min_size, "smallest buffer (all ranks' blocks), e.g. 8, 1KiB");
  app.add_option("--max-size", o.max_size, "largest buffer, e.g. 256MiB");
  app.add_option("--factor", o.factor, "size multiplier between steps of the sweep");
  app.add_option("--rounds", o.rounds, "interleaved zshard / raw MPI timing rounds per size (median reported)");
  app.add_option("--round-ms", o.round_ms, "length of a timing round: sets the calls per round (2 to 1000)");
  add_list_option(app, "--ops", o.ops, "collectives, comma separated");
  app.add_option("--json", o.json_path, "write the rows as JSON to this file");
  return run_tool("zshard-commbench", argc, argv, app, [&](comm::Communicator& world) {
    const int rank = world.rank(), n = world.size();
    int64_t min_bytes = 0, max_bytes = 0;
    std::vector<Collective> ops;
    run_agreed(world, [&] {
      min_bytes = parse_bytes(o.min_size, "--min-size");
      max_bytes = parse_bytes(o.max_size, "--max-size");
      if (!(o.round_ms > 0 && std::isfinite(o.round_ms))) throw UsageError("--round-ms must be a finite number > 0");
      if (max_bytes < min_bytes) throw UsageError("--max-size must be >= --min-size");
      // The raw MPI calls take an int count: the whole buffer of floats for all_reduce.
      if (max_bytes / 4 > int64_t(INT_MAX))
        throw UsageError("--max-size " + o.max_size + " is more than MPI's int count of floats (" +
                         format_bytes(4.0 * double(INT_MAX)) + ")");
      if (o.factor < 2) throw UsageError("--factor must be >= 2, got " + std::to_string(o.factor));
      if (o.rounds < 1) throw UsageError("--rounds must be >= 1, got " + std::to_string(o.rounds));
      for (const std::string& name : o.ops) ops.push_back(parse_op(name));
      // The largest size holds a send and a receive buffer and their host copies: about 4x per rank.
      const MemoryBudget budget = usable_memory(world.device(), comm::ranks_on_this_host());
      if (budget.bytes >= 0 && max_bytes > budget.bytes / 4)
        throw UsageError("--max-size " + o.max_size + " needs about " + format_bytes(4.0 * double(max_bytes)) +
                         " per rank; this rank can use " + format_bytes(double(budget.bytes)) + " (" + budget.source + ")");
      if (!o.json_path.empty() && rank == 0) check_output_path("--json", o.json_path);
    });
    auto* mpi = dynamic_cast<comm::MpiCommunicator*>(&world);
    const std::string iallreduce = mpi ? libnbc_iallreduce_algorithm() : "";
    if (rank == 0)
      std::cout << "zshard-commbench: " << n << " rank(s), backend " << world.backend() << ", float32, "
                << o.rounds << " round(s) per size" << (mpi ? ", raw MPI interleaved" : "")
                << (iallreduce.empty() ? "" : ", libnbc iallreduce algorithm " + iallreduce)
                << (comm::poll_policy().backoff ? ", waits back off (ranks outnumber cores)" : "") << "\n";
    json rows = json::array();
    int64_t total_wrong = 0;
    double min_ratio_from_1mib = 1e300;
    for (Collective op : ops) {
      if (rank == 0)
        std::cout << "\n# " << comm::collective_name(op) << "\n"
                  << std::setw(12) << "size(B)" << std::setw(12) << "count" << std::setw(7) << "type" << std::setw(12)
                  << "time(us)" << std::setw(13) << "algbw(GB/s)" << std::setw(13) << "busbw(GB/s)" << std::setw(8)
                  << "#wrong"
                  << (mpi ? "  raw-MPI time(us)   busbw   ratio  nonblocking-MPI busbw  ratio" : "") << "\n";
      int64_t measured_elems = 0;
      for (int64_t size = min_bytes; size <= max_bytes; size *= o.factor) {
        // Whole float blocks per rank: the size rounds down to a multiple of 4n bytes, and up to one float
        // per rank below that.
        const int64_t elems = op == Collective::all_reduce ? std::max<int64_t>(1, size / 4)
                                                           : std::max<int64_t>(1, size / 4 / n) * n;
        if (elems == measured_elems) continue;  // small sizes that round to the one just measured
        measured_elems = elems;
        Case c(world, op, elems);
        // zshard's own wrong elements (the row's #wrong), and the raw MPI calls' (checked alike: the total).
        double wrong[2] = {double(c.check([&] { c.zshard_call(); })), 0};
        if (mpi) {
          wrong[1] += double(c.check([&] { c.raw_call(mpi->handle()); }));
          wrong[1] += double(c.check([&] { c.raw_call(mpi->handle(), true); }));
        }
        comm::all_reduce_sum(world, wrong, 2);
        total_wrong += int64_t(wrong[0] + wrong[1]);
        c.zshard_call();  // warm-up
        if (mpi) c.raw_call(mpi->handle());
        // The same call count on every rank: from the rank-averaged time of one call.
        const double once = time_calls(world, 1, [&] { c.zshard_call(); });
        const int iters = int(std::clamp(o.round_ms / 1e3 / once, 2.0, 1000.0));
        std::vector<double> zs, raw, raw_nb;
        for (int r = 0; r < o.rounds; ++r) {
          zs.push_back(time_calls(world, iters, [&] { c.zshard_call(); }));
          if (!mpi) continue;
          raw.push_back(time_calls(world, iters, [&] { c.raw_call(mpi->handle()); }));
          raw_nb.push_back(time_calls(world, iters, [&] { c.raw_call(mpi->handle(), true); }));
        }
        const double t = median(zs), algbw = double(c.bytes()) / t / 1e9, busbw = algbw * bus_factor(op, n);
        json row = {{"op", comm::collective_name(op)}, {"size", c.bytes()}, {"count", c.elems()},
                    {"type", "float"}, {"time_us", t * 1e6}, {"algbw", algbw}, {"busbw", busbw},
                    {"wrong", int64_t(wrong[0])}, {"world", n}, {"iters", iters}};
        if (rank == 0)
          std::cout << std::setw(12) << c.bytes() << std::setw(12) << c.elems() << std::setw(7) << "float"
                    << std::fixed << std::setw(12) << std::setprecision(1) << t * 1e6 << std::setw(13)
                    << std::setprecision(3) << algbw << std::setw(13) << busbw << std::setw(8) << int64_t(wrong[0]);
        if (mpi) {
          const double rt = median(raw), rbus = double(c.bytes()) / rt / 1e9 * bus_factor(op, n);
          const double ratio = n > 1 ? busbw / rbus : 1.0;
          const double nb_bus = double(c.bytes()) / median(raw_nb) / 1e9 * bus_factor(op, n);
          const double nb_ratio = n > 1 ? busbw / nb_bus : 1.0;
          if (c.bytes() >= (1 << 20)) min_ratio_from_1mib = std::min(min_ratio_from_1mib, ratio);
          row["raw_wrong"] = int64_t(wrong[1]);
          row["raw_time_us"] = rt * 1e6;
          row["raw_busbw"] = rbus;
          row["busbw_ratio"] = ratio;
          row["raw_nonblocking_busbw"] = nb_bus;
          row["nonblocking_busbw_ratio"] = nb_ratio;
          if (rank == 0)
            std::cout << std::setw(18) << std::setprecision(1) << rt * 1e6 << std::setw(8) << std::setprecision(3)
                      << rbus << std::setw(8) << ratio << std::setw(23) << nb_bus << std::setw(7) << nb_ratio;
        }
        if (rank == 0) std::cout << "\n" << std::flush;
        rows.push_back(row);
      }
    }
    if (rank == 0) {
      std::cout << "\nwrong elements: " << total_wrong << (mpi ? " (zshard's and the raw MPI calls')" : "");
      if (mpi && n > 1 && min_ratio_from_1mib < 1e300)  // one rank moves nothing: no ratio to speak of
        std::cout << "; lowest zshard/raw MPI busbw ratio from 1 MiB up: " << std::setprecision(3)
                  << min_ratio_from_1mib;
      std::cout << "\n";
    }
    if (!o.json_path.empty()) {
      const json doc = {{"tool", "zshard-commbench"}, {"world", n}, {"backend", world.backend()},
                        {"libnbc_iallreduce_algorithm", iallreduce}, {"poll_backoff", comm::poll_policy().backoff},
                        {"rows", rows}};
      run_agreed(world, [&] {
        if (rank == 0) write_file_atomically(o.json_path, doc.dump(2) + "\n");
      });
    }
    // Summed over the ranks, so every rank knows: one line, from rank 0, and exit 1 everywhere.
    if (total_wrong > 0)
      throw AgreedFailure(detail::concat(total_wrong, " wrong elements", mpi ? " (zshard's and raw MPI's checks)" : ""), 1,
                          rank == 0);
  });
}
