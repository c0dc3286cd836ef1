// The world of one rank, with no MPI: every collective is a local copy (or nothing) and completes at once.
// It accepts every dtype and op, since with one rank a reduction is the identity, and host or device
// buffers: it is also what a GPU run of one rank reduces over (no NCCL, shard/device_setup.h).
#pragma once
#include <zshard/communicator.h>

#include "comm/backend_base.h"

namespace zshard::comm {

class SelfCommunicator : public Backend {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "self"; }

  WorkPtr all_gather(const void* send, void* recv, size_t count, DType dtype) override;
  WorkPtr reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override;
  WorkPtr all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override;
  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root) override;
  WorkPtr all_to_all(const void* send, void* recv, size_t count, DType dtype) override;
  void barrier() override {}
  std::unique_ptr<Communicator> split(int color, int key) override;

 private:
  // Counts and records the call (0 bytes: a group of one moves nothing) and returns a completed Work.
  WorkPtr done(Collective c, size_t count, DType dtype, int reduce, int root);
};

}  // namespace zshard::comm
