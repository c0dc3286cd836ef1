#include "comm/ring_reduce_scatter.h"

#include <cstring>

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
    default: fail("the ring reduce-scatter sums f32, f64, i32 and bf16, not ", dtype_name(dtype));
  }
}

}  // namespace

RingReduceScatter::RingReduceScatter(MPI_Comm comm, int tag, const void* send, void* recv, size_t count,
                                     DType dtype, MPI_Datatype type, bool consume)
    : comm_(comm), tag_(tag), input_(static_cast<char*>(const_cast<void*>(send))),
      recv_(static_cast<char*>(recv)), count_(count), block_bytes_(count * dtype_size(dtype)), dtype_(dtype),
      type_(type), consume_(consume) {
  ZS_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  ZS_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  if (size_ == 1) {
    if (send != recv) std::memcpy(recv_, input_, block_bytes_);
    return;
  }
  if (count == 0) return;
  if (send == recv) {  // the result's block overlaps the input's first one: sum from a copy
    input_copy_ = std::make_unique<Buffer>(block_bytes_ * size_t(size_), Device::cpu, Category::comm);
    std::memcpy(input_copy_->data(), recv, block_bytes_ * size_t(size_));
    input_ = static_cast<char*>(input_copy_->data());
    consume_ = true;
  }
  // Without the input to sum in, partial sums alternate between recv and this block: one is on its way to
  // the next rank while the other receives (the last step receiving into recv). Two ranks take one step.
  if (!consume_ && size_ > 2) scratch_ = std::make_unique<Buffer>(block_bytes_, Device::cpu, Category::comm);
  steps_ = size_ - 1;
  post_step();
}

RingReduceScatter::~RingReduceScatter() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (requests_[0] != MPI_REQUEST_NULL) MPI_Cancel(&requests_[0]);
  for (MPI_Request& request : requests_)
    if (request != MPI_REQUEST_NULL) MPI_Request_free(&request);
}

// Step s sends what rank r has summed of block r-1-s (its own block r-1 alone at step 0) to rank r+1, and
// receives from rank r-1 its partial of block r-2-s: at the last step, s = n-2, that is block r.
void RingReduceScatter::post_step() {
  const char* outgoing = step_ == 0 ? block(ring_block(-1)) : partial_;
  receiving_ = consume_ || (steps_ - 1 - step_) % 2 == 0 ? recv_ : static_cast<char*>(scratch_->data());
  const int count = int(count_);  // at most INT_MAX: checked by the communicator
  ZS_MPI_CHECK(MPI_Irecv(receiving_, count, type_, (rank_ + size_ - 1) % size_, tag_, comm_, &requests_[0]));
  ZS_MPI_CHECK(MPI_Isend(outgoing, count, type_, (rank_ + 1) % size_, tag_, comm_, &requests_[1]));
}

void RingReduceScatter::finish_step() {
  char* own = block(ring_block(-2 - step_));
  if (consume_ && step_ < steps_ - 1) {
    add_into(own, receiving_, count_, dtype_);  // the input's block, given up by the caller
    partial_ = own;
  } else {
    add_into(receiving_, own, count_, dtype_);
    partial_ = receiving_;
  }
}

bool RingReduceScatter::advance() {
  while (step_ < steps_) {
    int arrived = 0;
    ZS_MPI_CHECK(MPI_Testall(2, requests_, &arrived, MPI_STATUSES_IGNORE));
    if (!arrived) return false;
    finish_step();
    if (++step_ < steps_) post_step();
  }
  return true;
}

}  // namespace zshard::comm
