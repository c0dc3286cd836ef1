// The mpi backend's reductions: rings of point-to-point messages, the algorithm NCCL runs. A reduce-scatter
// takes n-1 steps: in each, a rank passes one block's partial sum to the next rank and adds its own block
// to the partial the previous rank passed it, so that block b is summed from rank b+1 round to rank b,
// which keeps it. An all-reduce is that over n chunks of its buffer, followed by n-1 steps that pass each
// finished chunk on round the ring. Each rank sends and receives (n-1)/n of the buffer per phase, the
// least these collectives can. Open MPI's non-blocking collectives allocate inside MPI, where zshard's
// memory report cannot see them: MPI_Ireduce_scatter_block twice its input, MPI_Iallreduce a copy of its
// buffer (docs/memory.md).
//
// A ring's memory is the caller's or the tracking allocator's. A reduce-scatter whose caller is done with
// its input forms the partial sums in it (consume) and allocates nothing; otherwise they alternate between
// recv and one block of scratch (none on two ranks), and an input given in place is copied first. An
// all-reduce sums in its buffer and receives each partial into one chunk of scratch.
//
// A communicator's rings run one at a time, in the order they were issued (the order every member issues
// them in, as on a NCCL stream), each taking its scratch when it starts and giving it back when it ends:
// a communicator holds one ring's scratch at most, however many are in flight. Nor do their messages need
// tags apart: MPI delivers two ranks' messages in the order they were sent, and each ring receives from
// its neighbour exactly the messages it sends, so a ring's receives match its own. Like MPI's own
// non-blocking collectives they move only inside MPI calls: every poll of the mpi backend runs
// progress_rings(), which moves every ring of the process on, as Open MPI's progress engine moves all of
// its operations, so that a rank waiting on one communicator still does its part of another's ring.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <memory>
#include <vector>

#include <zshard/dtype.h>
#include <zshard/memory.h>

namespace zshard::comm {

class RingReduction {
 public:
  // `send` holds size(comm) blocks of `count` elements; rank r's block of the sum lands in `recv`. `send`
  // may equal `recv` (in place: the input is read from recv, the block lands at its start). With
  // `consume`, `send` is overwritten.
  static std::unique_ptr<RingReduction> reduce_scatter(MPI_Comm comm, const void* send, void* recv,
                                                       size_t count, DType dtype, MPI_Datatype type, bool consume);
  // The sum of every rank's `buf` (count elements) lands in `buf` on every rank.
  static std::unique_ptr<RingReduction> all_reduce(MPI_Comm comm, void* buf, size_t count, DType dtype,
                                                   MPI_Datatype type);

  // A ring given up before its end (its collective timed out) leaves its communicator's queue and cancels
  // the receive it posted; what MPI may still touch of its own buffers stays allocated.
  ~RingReduction();
  RingReduction(const RingReduction&) = delete;
  RingReduction& operator=(const RingReduction&) = delete;

  // True once the result is in place; progress_rings() moves it there.
  bool finished() const { return finished_; }

 private:
  RingReduction(MPI_Comm comm, DType dtype, MPI_Datatype type);
  friend void progress_rings();
  // Queued behind the rings issued before it on its communicator.
  void enqueue();
  // Takes its scratch and posts its first step, once at the head of its queue.
  void start();
  // Moves on as far as the messages that have arrived allow; true once the result is in place.
  bool advance();
  // Splits `count` elements into the ring's blocks: block b holds [begin_[b], begin_[b+1]).
  void set_blocks(size_t count);
  char* block(int b) const { return input_ + begin_[size_t(b)] * element_bytes_; }
  int length(int b) const { return int(begin_[size_t(b) + 1] - begin_[size_t(b)]); }
  int ring_block(int offset) const { return ((rank_ + offset) % size_ + size_) % size_; }
  void post_step();
  void finish_step();

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  DType dtype_;
  MPI_Datatype type_;
  size_t element_bytes_;
  char* input_ = nullptr;  // the blocks; written only when consumed, in an all-reduce, or a copy of ours
  std::vector<size_t> begin_;
  char* recv_ = nullptr;    // where the last reduction step receives (an all-reduce's scratch)
  bool consume_ = false;
  bool all_reduce_ = false;  // the last reduction step sums into the input's block, then the ring gathers
  bool started_ = false, finished_ = false;
  std::unique_ptr<Buffer> input_copy_, scratch_;
  int step_ = 0, reduce_steps_ = 0, steps_ = 0;
  char* partial_ = nullptr;  // where the last finished step formed its partial sum: what the next one sends
  char* receiving_ = nullptr;
  MPI_Request requests_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // this step's receive and send
};

// Moves every ring in flight in this process on, each communicator's in issue order. Never blocks.
void progress_rings();

}  // namespace zshard::comm
