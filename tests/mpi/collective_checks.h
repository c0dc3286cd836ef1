// Collectives checked against values known in closed form, shared by the host-buffer tests
// (test_collectives.cpp) and the device-buffer ones (test_device_collectives.cpp). Rank r contributes
// value(r, i), multiples of 1/4 small enough that sums over the ranks are exact in f32, so sums compare
// exactly and averages to a few ulps.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <zshard/communicator.h>

namespace zshard::comm::test_checks {

constexpr size_t kCounts[] = {1, 7, 1000, (1 << 16) + 3};

inline double value(int rank, size_t i) { return 0.5 * (rank + 1) + 0.25 * double(i % 1013); }

inline std::vector<int> all_ranks(int n) {
  std::vector<int> ranks(n);
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

template <class T>
std::vector<T> contribution(int rank, size_t count) {
  std::vector<T> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = T(value(rank, i));
  return v;
}

// Compares got[k] with want(k) for every k, to rel_tol; reports the first mismatch only.
template <class T, class Want>
void expect_all(const std::vector<T>& got, Want want, double rel_tol, const std::string& what) {
  for (size_t k = 0; k < got.size(); ++k) {
    const double w = want(k);
    if (std::abs(double(got[k]) - w) > rel_tol * std::abs(w)) {
      ADD_FAILURE() << what << ": element " << k << " of " << got.size() << " is " << double(got[k])
                    << ", want " << w;
      return;
    }
  }
}

template <class T>
double tolerance(ReduceOp op) {
  return op == ReduceOp::avg ? 4 * std::numeric_limits<T>::epsilon() : 0;
}

inline const char* op_name(ReduceOp op) { return op == ReduceOp::avg ? "avg" : "sum"; }

// `members` lists the world ranks of `comm` in its rank order: contributions are value(world rank, i).
template <class T>
void check_all_gather(Communicator& comm, const std::vector<int>& members, size_t count, bool in_place) {
  const int n = comm.size(), me = comm.rank();
  const auto mine = contribution<T>(members[me], count);
  std::vector<T> recv(n * count, T(-1));
  const T* send = mine.data();
  if (in_place) {
    std::copy(mine.begin(), mine.end(), recv.begin() + me * count);
    send = recv.data() + me * count;
  }
  comm.all_gather(send, recv.data(), count, dtype_of<T>())->wait();
  expect_all(recv, [&](size_t k) { return value(members[k / count], k % count); }, 0,
             "all_gather of " + std::to_string(count) + (in_place ? " in place" : ""));
}

template <class T>
void check_reduce_scatter(Communicator& comm, const std::vector<int>& members, size_t count, ReduceOp op,
                          bool in_place) {
  const int n = comm.size(), me = comm.rank();
  auto send = contribution<T>(members[me], n * count);
  std::vector<T> recv(count, T(-1));
  if (in_place) {
    comm.reduce_scatter(send.data(), send.data(), count, dtype_of<T>(), op)->wait();
    recv.assign(send.begin(), send.begin() + count);
  } else {
    comm.reduce_scatter(send.data(), recv.data(), count, dtype_of<T>(), op)->wait();
  }
  expect_all(recv, [&](size_t i) {
    double sum = 0;
    for (int m : members) sum += value(m, me * count + i);
    return op == ReduceOp::avg ? sum / n : sum;
  }, tolerance<T>(op), std::string("reduce_scatter ") + op_name(op) + " of " + std::to_string(count));
}

template <class T>
void check_all_reduce(Communicator& comm, const std::vector<int>& members, size_t count, ReduceOp op) {
  auto buf = contribution<T>(members[comm.rank()], count);
  comm.all_reduce(buf.data(), count, dtype_of<T>(), op)->wait();
  expect_all(buf, [&](size_t i) {
    double sum = 0;
    for (int m : members) sum += value(m, i);
    return op == ReduceOp::avg ? sum / comm.size() : sum;
  }, tolerance<T>(op), std::string("all_reduce ") + op_name(op) + " of " + std::to_string(count));
}

template <class T>
void check_broadcast(Communicator& comm, const std::vector<int>& members, size_t count, int root) {
  auto buf = comm.rank() == root ? contribution<T>(members[root], count) : std::vector<T>(count, T(-1));
  comm.broadcast(buf.data(), count, dtype_of<T>(), root)->wait();
  expect_all(buf, [&](size_t i) { return value(members[root], i); }, 0,
             "broadcast of " + std::to_string(count) + " from root " + std::to_string(root));
}

// Block d of a rank's send is value(its world rank, d*count + i): rank me receives, from each member s,
// value(s, me*count + i) at block s.
template <class T>
void check_all_to_all(Communicator& comm, const std::vector<int>& members, size_t count) {
  const int n = comm.size(), me = comm.rank();
  const auto send = contribution<T>(members[me], n * count);
  std::vector<T> recv(n * count, T(-1));
  comm.all_to_all(send.data(), recv.data(), count, dtype_of<T>())->wait();
  expect_all(recv, [&](size_t k) { return value(members[k / count], me * count + k % count); }, 0,
             "all_to_all of " + std::to_string(count));
}

}  // namespace zshard::comm::test_checks
