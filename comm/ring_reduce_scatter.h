// The mpi backend's reduce-scatter: a ring of point-to-point messages, the algorithm NCCL runs. In n-1
// steps each rank passes one block's partial sum to the next rank and adds its own block to the partial
// the previous rank passed it, so block b is summed from rank b+1 round to rank b, which keeps it. Each
// rank sends and receives (n-1)/n of the buffer, the least a reduce-scatter can. Open MPI's non-blocking
// MPI_Ireduce_scatter_block reduces to one rank and scatters from there instead: more traffic through
// that rank, and buffers as large as the whole input allocated inside MPI, where zshard's memory report
// cannot see them (docs/memory.md).
//
// The ring's memory is the caller's or the tracking allocator's. A caller done with its input lets the
// ring form the partial sums in it (consume): nothing is allocated. Otherwise they are formed in recv and
// one block of scratch (none on two ranks); an input given in place is copied first.
//
// Like MPI's non-blocking collectives it moves only when polled: advance() never blocks.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <memory>

#include <zshard/dtype.h>
#include <zshard/memory.h>

namespace zshard::comm {

class RingReduceScatter {
 public:
  // `send` holds size(comm) blocks of `count` elements; rank r's block of the sum lands in `recv`. `send`
  // may equal `recv` (in place: the input is read from recv, the block lands at its start). `tag` must
  // differ from every other ring's in flight on `comm`. With `consume`, `send` is overwritten.
  RingReduceScatter(MPI_Comm comm, int tag, const void* send, void* recv, size_t count, DType dtype,
                    MPI_Datatype type, bool consume);
  // A ring given up before its end (its collective timed out) cancels the receive it posted, so that no
  // late message lands in freed memory.
  ~RingReduceScatter();
  RingReduceScatter(const RingReduceScatter&) = delete;
  RingReduceScatter& operator=(const RingReduceScatter&) = delete;

  // Moves the ring on as far as the messages that have arrived allow; true once recv holds the result.
  bool advance();

 private:
  char* block(int b) const { return input_ + size_t(b) * block_bytes_; }
  int ring_block(int offset) const { return ((rank_ + offset) % size_ + size_) % size_; }
  void post_step();
  void finish_step();

  MPI_Comm comm_;
  int tag_;
  int rank_ = 0, size_ = 1;
  char* input_;    // the n blocks; written only when consumed (or a copy of ours)
  char* recv_;
  size_t count_;
  size_t block_bytes_;
  DType dtype_;
  MPI_Datatype type_;
  bool consume_;
  std::unique_ptr<Buffer> input_copy_, scratch_;
  int step_ = 0, steps_ = 0;
  char* partial_ = nullptr;  // where the last finished step formed its partial sum: what the next one sends
  char* receiving_ = nullptr;
  MPI_Request requests_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // this step's receive and send
};

}  // namespace zshard::comm
