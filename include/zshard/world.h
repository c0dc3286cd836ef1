// The ranks a job runs on: under mpirun or srun, MPI's world (initialised here, finalised at the end);
// a plain run is a world of one that needs no MPI at all.
#pragma once
#include <memory>

#include <zshard/communicator.h>

namespace zshard {

class World {
 public:
  World(int* argc, char*** argv);  // once per process, before any other zshard call that communicates
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  comm::Communicator& comm() { return *comm_; }
  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  // Ends every rank of the job at once: what a rank that fails on its own must do, or its peers would
  // wait for it in their next collective until the deadline.
  [[noreturn]] static void abort(int exit_code);

 private:
  std::unique_ptr<comm::Communicator> comm_;
};

}  // namespace zshard
