// zshard-test-np: 1 2 3 4
// The mpi backend's rings (comm/ring_reduction.h): the closed-form results of every reduce-scatter mode,
// the order in which they sum, rings in flight together, what they allocate (through the tracker and past
// it), and their messages kept apart from a user's own on the same communicator. The closed forms of
// every collective are test_collectives.cpp's.
#include <gtest/gtest.h>
#include <malloc.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include <zshard/communicator.h>
#include <zshard/memory.h>

#include "kernels/allocator.h"
#include "tests/mpi/collective_checks.h"
#include "tests/support/test_support.h"

namespace zshard::comm {
namespace {

using test::world;
using namespace test_checks;

template <class T>
double reduced(const std::vector<int>& members, size_t k, ReduceOp op) {
  double sum = 0;
  for (int m : members) sum += double(T(value(m, k)));  // integers truncate each contribution
  return op == ReduceOp::avg ? sum / double(members.size()) : sum;
}

// The consumed input is the ring's to write; the one given as const must come back as it was.
template <class T>
void check_consuming(size_t count, ReduceOp op) {
  auto& comm = world();
  const int n = comm.size(), me = comm.rank();
  const std::vector<int> members = all_ranks(n);
  const auto input = contribution<T>(me, n * count);
  auto consumed = input;
  std::vector<T> from_const(count, T(-1)), from_consumed(count, T(-1));
  comm.reduce_scatter(input.data(), from_const.data(), count, dtype_of<T>(), op)->wait();
  comm.reduce_scatter_consuming(consumed.data(), from_consumed.data(), count, dtype_of<T>(), op)->wait();
  const std::string what = std::string(op_name(op)) + " of " + std::to_string(count);
  expect_all(from_consumed, [&](size_t i) { return reduced<T>(members, me * count + i, op); }, tolerance<T>(op),
             "consuming " + what);
  EXPECT_EQ(from_consumed, from_const) << what << ": the two modes sum in one order";
  EXPECT_EQ(input, contribution<T>(me, n * count)) << what << ": a const input was written";
}

TEST(RingReduction, ConsumingGivesTheClosedFormAndConstLeavesTheInput) {
  for (size_t count : kCounts)
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      check_consuming<float>(count, op);
      check_consuming<double>(count, op);
    }
  check_consuming<int32_t>(1000, ReduceOp::sum);
}

// Block b is summed from rank b+1 round the ring to rank b, each step in fp32 rounded to bf16 once (as
// NCCL's ring). Rank r adds 2^-8 * (r+1) to 1: the order of the roundings decides the result's bits.
TEST(RingReduction, Bf16RoundsOnceAtEveryStepInRingOrder) {
  auto& comm = world();
  const int n = comm.size(), me = comm.rank();
  const size_t count = 3;
  auto contribution_of = [&](int rank, int block, size_t i) {
    return bf16(rank == block ? 1.0f : float(rank + 1) * 0x1p-8f * float(i + 1));
  };
  std::vector<bf16> input(n * count), consumed, from_const(count), from_consumed(count);
  for (int b = 0; b < n; ++b)
    for (size_t i = 0; i < count; ++i) input[b * count + i] = contribution_of(me, b, i);
  consumed = input;
  comm.reduce_scatter(input.data(), from_const.data(), count, DType::bf16, ReduceOp::sum)->wait();
  comm.reduce_scatter_consuming(consumed.data(), from_consumed.data(), count, DType::bf16, ReduceOp::sum)->wait();
  for (size_t i = 0; i < count; ++i) {
    bf16 want = contribution_of((me + 1) % n, me, i);
    for (int step = 2; step <= n; ++step) want = bf16(float(want) + float(contribution_of((me + step) % n, me, i)));
    EXPECT_EQ(float(from_const[i]), float(want)) << i;
    EXPECT_EQ(float(from_consumed[i]), float(want)) << i;
  }
}

// An all-reduce is the reduce-scatter of its chunks, then passed round: where the ranks divide the buffer,
// rank r's chunk of the all-reduce is bit for bit the reduce-scatter's block r (so ddp and the sharded
// strategies sum alike), and every rank ends with the same bits. Values that no order sums exactly.
TEST(RingReduction, AllReduceIsTheReduceScattersBlocksBitForBit) {
  auto& comm = world();
  const int n = comm.size(), me = comm.rank();
  const size_t count = 1000;
  std::vector<float> input(n * count);
  std::vector<bf16> input16(n * count);
  for (size_t k = 0; k < input.size(); ++k) {
    input[k] = 1.0f / float(3 + (k * 7 + size_t(me) * 13) % 101);
    input16[k] = bf16(input[k]);
  }
  auto reduced = input;
  auto reduced16 = input16;
  std::vector<float> block(count);
  std::vector<bf16> block16(count);
  comm.all_reduce(reduced.data(), reduced.size(), DType::f32, ReduceOp::sum)->wait();
  comm.all_reduce(reduced16.data(), reduced16.size(), DType::bf16, ReduceOp::sum)->wait();
  comm.reduce_scatter(input.data(), block.data(), count, DType::f32, ReduceOp::sum)->wait();
  comm.reduce_scatter(input16.data(), block16.data(), count, DType::bf16, ReduceOp::sum)->wait();
  EXPECT_EQ(std::vector<float>(reduced.begin() + me * count, reduced.begin() + (me + 1) * count), block);
  for (size_t i = 0; i < count; ++i)
    ASSERT_EQ(float(reduced16[me * count + i]), float(block16[i])) << "bf16 element " << i;
  std::vector<float> everyones(n * reduced.size());
  comm.all_gather(reduced.data(), everyones.data(), reduced.size(), DType::f32)->wait();
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(std::equal(reduced.begin(), reduced.end(), everyones.begin() + r * reduced.size())) << "rank " << r;
}

// A consumed input is summed in while the ring receives into recv: the two may not overlap (NCCL's in-place
// layout, recv inside send, is the plain reduce_scatter's), refused before anything is issued.
TEST(RingReduction, AConsumedInputMayNotOverlapTheResult) {
  auto& comm = world();
  const int n = comm.size(), me = comm.rank();
  if (n == 1) GTEST_SKIP() << "a group of one copies its block";
  auto input = contribution<float>(me, n * 7);
  const std::string error = test::error_of(
      [&] { comm.reduce_scatter_consuming(input.data(), input.data() + me * 7, 7, DType::f32, ReduceOp::sum); });
  EXPECT_TRUE(error.ends_with(": a consumed send must not overlap recv")) << error;
  std::vector<float> apart(7);
  comm.reduce_scatter_consuming(input.data(), apart.data(), 7, DType::f32, ReduceOp::sum)->wait();  // still in step
}

// Rings in flight together, of different sizes and modes, waited in reverse order: every one lands its
// own block (one tag for all of them: each ring's receives match its own messages, by MPI's order).
TEST(RingReduction, RingsInFlightTogetherKeepTheirMessagesApart) {
  auto& comm = world();
  const int n = comm.size(), me = comm.rank();
  const std::vector<int> members = all_ranks(n);
  const std::vector<size_t> counts{1000, 7, (1 << 16) + 3, 1, 1000};
  std::vector<std::vector<double>> inputs, outputs;
  std::vector<WorkPtr> works;
  for (size_t k = 0; k < counts.size(); ++k) {
    inputs.push_back(contribution<double>(me, n * counts[k]));
    outputs.emplace_back(counts[k], -1.0);
    works.push_back(k % 2 ? comm.reduce_scatter(inputs[k].data(), outputs[k].data(), counts[k], DType::f64,
                                                ReduceOp::sum)
                          : comm.reduce_scatter_consuming(inputs[k].data(), outputs[k].data(), counts[k],
                                                          DType::f64, ReduceOp::sum));
  }
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  for (size_t k = 0; k < counts.size(); ++k)
    expect_all(outputs[k], [&](size_t i) { return reduced<double>(members, me * counts[k] + i, ReduceOp::sum); }, 0,
               "ring " + std::to_string(k) + " of " + std::to_string(counts[k]));
}

// A communicator's rings run one at a time, each with its own scratch while it runs: three all-reduces in
// flight together hold the largest one's chunk at most, not the three.
TEST(RingReduction, ACommunicatorHoldsOneRingsScratchAtATime) {
  auto& comm = world();
  const int n = comm.size();
  if (n == 1) GTEST_SKIP() << "a group of one reduces nothing";
  const std::vector<size_t> counts{size_t(n) << 16, size_t(n) << 18, size_t(n) << 17};
  std::vector<std::vector<float>> buffers;
  for (size_t count : counts) buffers.push_back(contribution<float>(comm.rank(), count));
  Allocator& host = Allocator::of(Device::cpu);
  comm.barrier();
  host.reset_peaks();
  const int64_t live = host.stats().live[int(Category::comm)];
  std::vector<WorkPtr> works;
  for (auto& b : buffers) works.push_back(comm.all_reduce(b.data(), b.size(), DType::f32, ReduceOp::sum));
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  EXPECT_EQ(host.stats().peak[int(Category::comm)] - live, int64_t((size_t(1) << 18) * sizeof(float)));
  EXPECT_EQ(host.stats().live[int(Category::comm)], live);
  for (size_t k = 0; k < counts.size(); ++k)
    expect_all(buffers[k], [&](size_t i) { return reduced<float>(all_ranks(n), i, ReduceOp::sum); }, 0,
               "all_reduce " + std::to_string(k));
}

// Waiting on one communicator moves the rings of every other: rank 0 waits on b's all-reduce while the
// others wait on a's, issued first. Were a ring moved only by waits on its own Work, rank 0 would never
// do its part of a's, and both waits would time out.
TEST(RingReduction, AWaitOnOneCommunicatorMovesTheRingsOfAnother) {
  auto& comm = world();
  const int n = comm.size(), me = comm.rank();
  auto a = comm.split(0, me), b = comm.split(0, me);
  a->set_timeout(std::chrono::seconds(20));
  b->set_timeout(std::chrono::seconds(20));
  auto x = contribution<double>(me, size_t(n) << 16), y = contribution<double>(me, size_t(n) << 16);
  WorkPtr on_a = a->all_reduce(x.data(), x.size(), DType::f64, ReduceOp::sum);
  WorkPtr on_b = b->all_reduce(y.data(), y.size(), DType::f64, ReduceOp::sum);
  if (me == 0) on_b->wait();
  on_a->wait();
  on_b->wait();
  const auto want = [&](size_t i) { return reduced<double>(all_ranks(n), i, ReduceOp::sum); };
  expect_all(x, want, 0, "a");
  expect_all(y, want, 0, "b");
}

// Consuming, the reduce-scatter allocates nothing: not through the tracker, and not past it (the heap's
// bytes in use, sampled at every poll, stay put; MPI_Ireduce_scatter_block held twice the input there).
// Given a const input it tracks one block of scratch from three ranks on, in place a copy of the input.
TEST(RingReduction, AllocatesNothingConsumingAndTracksWhatItNeedsOtherwise) {
  auto& comm = world();
  const int n = comm.size();
  if (n == 1) GTEST_SKIP() << "a group of one copies its block";
  const size_t count = size_t(1) << 20, block = count * sizeof(float);
  auto input = contribution<float>(comm.rank(), n * count);
  std::vector<float> out(count);
  Allocator& host = Allocator::of(Device::cpu);
  const auto tracked_peak_of = [&](auto issue) {
    comm.barrier();
    host.reset_peaks();
    const int64_t live = host.stats().live[int(Category::comm)];
    // The heap's bytes in use, tracked or not, minus what the tracker holds beyond `live`.
    const auto untracked = [&] {
      const struct mallinfo2 heap = mallinfo2();
      return int64_t(heap.uordblks + heap.hblkhd) - (host.stats().live[int(Category::comm)] - live);
    };
    const int64_t before = untracked();
    int64_t most = before;
    WorkPtr work = issue();
    do most = std::max(most, untracked());
    while (!work->test());
    EXPECT_LT(most - before, int64_t(block / 16)) << "untracked heap growth while the ring ran";
    return host.stats().peak[int(Category::comm)] - live;
  };
  EXPECT_EQ(tracked_peak_of([&] {
              return comm.reduce_scatter_consuming(input.data(), out.data(), count, DType::f32, ReduceOp::sum);
            }), 0);
  EXPECT_EQ(tracked_peak_of([&] {
              return comm.reduce_scatter(input.data(), out.data(), count, DType::f32, ReduceOp::sum);
            }), n > 2 ? int64_t(block) : 0);
  EXPECT_EQ(tracked_peak_of([&] {
              return comm.reduce_scatter(input.data(), input.data(), count, DType::f32, ReduceOp::sum);
            }), int64_t(n * block));
  // An all-reduce of n blocks receives into one chunk of scratch (MPI_Iallreduce copied the buffer).
  EXPECT_EQ(tracked_peak_of([&] { return comm.all_reduce(input.data(), n * count, DType::f32, ReduceOp::sum); }),
            int64_t(block));
}

// The rings travel on a duplicate of the communicator: a receive of the user's own, posted on
// MPI_COMM_WORLD for any source and tag before a ring runs, still gets the user's message after it.
TEST(RingReduction, AUsersOwnReceiveOnTheWorldNeverMatchesTheRing) {
  auto& comm = world();
  const int n = comm.size(), me = comm.rank();
  if (n == 1) GTEST_SKIP() << "a group of one sends nothing";
  int got = -1;
  MPI_Request mine = MPI_REQUEST_NULL;
  ASSERT_EQ(MPI_Irecv(&got, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &mine), MPI_SUCCESS);
  auto input = contribution<float>(me, n * 7);
  std::vector<float> out(7);
  comm.reduce_scatter(input.data(), out.data(), 7, DType::f32, ReduceOp::sum)->wait();
  int flag = 0;
  ASSERT_EQ(MPI_Test(&mine, &flag, MPI_STATUS_IGNORE), MPI_SUCCESS);
  EXPECT_FALSE(flag) << "the user's receive matched a message of the ring: it holds " << got;
  comm.barrier();  // every rank has looked before any sends its own message
  const int sent = 1000 + me;
  ASSERT_EQ(MPI_Send(&sent, 1, MPI_INT, (me + 1) % n, 5, MPI_COMM_WORLD), MPI_SUCCESS);
  ASSERT_EQ(MPI_Wait(&mine, MPI_STATUS_IGNORE), MPI_SUCCESS);
  EXPECT_EQ(got, 1000 + (me + n - 1) % n);
}

}  // namespace
}  // namespace zshard::comm
