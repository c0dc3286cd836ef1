#include "comm/ring_reduction.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>

#include <zshard/error.h>

#include "comm/mpi_communicator.h"

namespace zshard::comm {

namespace {

template <class T>
void add(T* into, const T* from, size_t count) {
  for (size_t i = 0; i < count; ++i) into[i] += from[i];
}

// into += from, element by element. bf16 as NCCL sums it: in fp32, rounded once per step.
void add_into(void* into, const void* from, size_t count, DType dtype) {
  switch (dtype) {
    case DType::f32: return add(static_cast<float*>(into), static_cast<const float*>(from), count);
    case DType::f64: return add(static_cast<double*>(into), static_cast<const double*>(from), count);
    case DType::i32: return add(static_cast<int32_t*>(into), static_cast<const int32_t*>(from), count);
    case DType::bf16: {
      bf16* b = static_cast<bf16*>(into);
      const bf16* a = static_cast<const bf16*>(from);
      for (size_t i = 0; i < count; ++i) b[i] = bf16(float(b[i]) + float(a[i]));
      return;
    }
    default: fail("a ring reduction sums f32, f64, i32 and bf16, not ", dtype_name(dtype));
  }
}

// Each communicator's rings, head first. Only the thread that calls MPI touches them.
std::map<MPI_Comm, std::deque<RingReduction*>>& queues() {
  static std::map<MPI_Comm, std::deque<RingReduction*>> q;
  return q;
}

// One tag for every ring: see the header.
constexpr int kRingTag = 0;

}  // namespace

RingReduction::RingReduction(MPI_Comm comm, DType dtype, MPI_Datatype type)
    : comm_(comm), dtype_(dtype), type_(type), element_bytes_(dtype_size(dtype)) {
  ZS_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  ZS_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

void RingReduction::set_blocks(size_t count) {
  // The first count % n blocks hold one element more: equal blocks where n divides the count.
  begin_.resize(size_t(size_) + 1);
  for (size_t b = 0; b <= size_t(size_); ++b) begin_[b] = b * (count / size_t(size_)) + std::min(b, count % size_t(size_));
}

std::unique_ptr<RingReduction> RingReduction::reduce_scatter(MPI_Comm comm, const void* send, void* recv,
                                                             size_t count, DType dtype, MPI_Datatype type,
                                                             bool consume) {
  std::unique_ptr<RingReduction> ring(new RingReduction(comm, dtype, type));
  ring->input_ = static_cast<char*>(const_cast<void*>(send));
  ring->recv_ = static_cast<char*>(recv);
  ring->consume_ = consume;
  ring->set_blocks(count * size_t(ring->size_));
  ring->enqueue();
  return ring;
}

std::unique_ptr<RingReduction> RingReduction::all_reduce(MPI_Comm comm, void* buf, size_t count,
                                                         DType dtype, MPI_Datatype type) {
  std::unique_ptr<RingReduction> ring(new RingReduction(comm, dtype, type));
  ring->input_ = static_cast<char*>(buf);
  ring->consume_ = ring->all_reduce_ = true;
  ring->set_blocks(count);
  ring->enqueue();
  return ring;
}

void RingReduction::enqueue() { queues()[comm_].push_back(this); }

// started_ is set once nothing can throw: a ring whose scratch could not be had is tried again at the next
// poll (and fails there again), never taken as begun.
void RingReduction::start() {
  const size_t block_bytes = size_t(length(0)) * element_bytes_;
  if (size_ == 1 || begin_.back() == 0) {
    if (size_ == 1 && !all_reduce_ && recv_ != input_) std::memcpy(recv_, input_, block_bytes);
    started_ = true;
    return;
  }
  if (all_reduce_) {
    scratch_ = std::make_unique<Buffer>(block_bytes, Device::cpu, Category::comm);  // block 0 is the largest
    recv_ = static_cast<char*>(scratch_->data());
  } else {
    if (recv_ == input_) {  // the result's block overlaps the input's first one: sum from a copy
      input_copy_ = std::make_unique<Buffer>(block_bytes * size_t(size_), Device::cpu, Category::comm);
      std::memcpy(input_copy_->data(), input_, block_bytes * size_t(size_));
      input_ = static_cast<char*>(input_copy_->data());
      consume_ = true;
    }
    // Without the input to sum in, partial sums alternate between recv and this block: one is on its way
    // to the next rank while the other receives (the last step receiving into recv). Two ranks take one
    // step.
    if (!consume_ && size_ > 2) scratch_ = std::make_unique<Buffer>(block_bytes, Device::cpu, Category::comm);
  }
  reduce_steps_ = size_ - 1;
  steps_ = all_reduce_ ? 2 * reduce_steps_ : reduce_steps_;
  started_ = true;
  post_step();
}

RingReduction::~RingReduction() {
  auto& all = queues();
  if (auto q = all.find(comm_); q != all.end()) {
    std::erase(q->second, this);
    if (q->second.empty()) all.erase(q);
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (requests_[0] != MPI_REQUEST_NULL) MPI_Cancel(&requests_[0]);
  int over = 1;
  MPI_Testall(2, requests_, &over, MPI_STATUSES_IGNORE);
  if (over) return;
  // A receive already matched cannot be cancelled, and a send may still be read: MPI may yet touch the
  // ring's own buffers, which are left allocated (the job is ending: a collective failed or timed out).
  for (MPI_Request& request : requests_)
    if (request != MPI_REQUEST_NULL) MPI_Request_free(&request);
  (void)scratch_.release();
  (void)input_copy_.release();
}

// Reduction step s sends what rank r has summed of block r-1-s (its own block r-1 alone at step 0) to rank
// r+1, and receives from rank r-1 its partial of block r-2-s: at the last one, s = n-2, that is block r.
// All-gather step g then sends the finished block r-g and receives block r-1-g in its place.
void RingReduction::post_step() {
  const int previous = (rank_ + size_ - 1) % size_, next = (rank_ + 1) % size_;
  int outgoing_block = 0, incoming_block = 0;
  const char* outgoing = nullptr;
  if (step_ < reduce_steps_) {
    outgoing_block = ring_block(-1 - step_);
    incoming_block = ring_block(-2 - step_);
    outgoing = step_ == 0 ? block(outgoing_block) : partial_;
    receiving_ = consume_ || (reduce_steps_ - 1 - step_) % 2 == 0 ? recv_ : static_cast<char*>(scratch_->data());
  } else {
    const int g = step_ - reduce_steps_;
    outgoing_block = ring_block(-g);
    incoming_block = ring_block(-1 - g);
    outgoing = block(outgoing_block);
    receiving_ = block(incoming_block);
  }
  ZS_MPI_CHECK(MPI_Irecv(receiving_, length(incoming_block), type_, previous, kRingTag, comm_, &requests_[0]));
  ZS_MPI_CHECK(MPI_Isend(outgoing, length(outgoing_block), type_, next, kRingTag, comm_, &requests_[1]));
}

void RingReduction::finish_step() {
  if (step_ >= reduce_steps_) return;  // all-gather: received in place
  const int b = ring_block(-2 - step_);
  char* own = block(b);
  const bool last = step_ == reduce_steps_ - 1;
  if (consume_ && (!last || all_reduce_)) {
    add_into(own, receiving_, size_t(length(b)), dtype_);  // the input's block, the ring's to write
    partial_ = own;
  } else {
    add_into(receiving_, own, size_t(length(b)), dtype_);
    partial_ = receiving_;
  }
}

bool RingReduction::advance() {
  while (step_ < steps_) {
    int arrived = 0;
    ZS_MPI_CHECK(MPI_Testall(2, requests_, &arrived, MPI_STATUSES_IGNORE));
    if (!arrived) return false;
    finish_step();
    if (++step_ < steps_) post_step();
  }
  return true;
}

void progress_rings() {
  auto& all = queues();
  for (auto q = all.begin(); q != all.end();) {
    std::deque<RingReduction*>& rings = q->second;
    while (!rings.empty()) {
      RingReduction& head = *rings.front();
      if (!head.started_) head.start();
      if (!head.advance()) break;
      head.finished_ = true;
      head.scratch_.reset();  // the next ring of the communicator takes its own
      head.input_copy_.reset();
      rings.pop_front();
    }
    q = rings.empty() ? all.erase(q) : std::next(q);
  }
}

}  // namespace zshard::comm
