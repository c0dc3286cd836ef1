// Which communicator a run's collectives go over (shard/device_setup.h), decided without a GPU: NCCL only
// where two ranks or more talk. A world of one on cuda (--comm defaults to nccl there) gets the self
// communicator and never touches NCCL, so its bootstrap can neither cost nor fail such a run.
#include <gtest/gtest.h>

#include <chrono>

#include "comm/self_communicator.h"
#include "runtime/train/trainer.h"
#include "shard/device_setup.h"

namespace zshard {
namespace {

TEST(DeviceComm, OnlyTwoRanksOrMoreOpenNccl) {
  EXPECT_FALSE(opens_nccl(CommBackend::nccl, 1));
  EXPECT_TRUE(opens_nccl(CommBackend::nccl, 2));
  EXPECT_TRUE(opens_nccl(CommBackend::nccl, 8));
  EXPECT_FALSE(opens_nccl(CommBackend::mpi, 1));
  EXPECT_FALSE(opens_nccl(CommBackend::mpi, 4));
}

TEST(DeviceComm, CudaAtWorldOneGetsTheSelfCommunicator) {
  TrainOptions o;
  o.plan.placement.device = Device::cuda;
  ASSERT_EQ(comm_backend(o.plan), CommBackend::nccl) << "the default on cuda";
  comm::SelfCommunicator world;
  world.set_timeout(std::chrono::seconds(7));
  // What the trainer opens for it: no NCCL communicator (this build may have no NCCL at all).
  const std::unique_ptr<comm::Communicator> collectives = open_device_comm(comm_backend(o.plan), world);
  ASSERT_NE(collectives, nullptr);
  EXPECT_EQ(collectives->backend(), "self");
  EXPECT_EQ(collectives->size(), 1);
  EXPECT_EQ(collectives->timeout(), std::chrono::seconds(7)) << "the world's --comm-timeout";
  EXPECT_EQ(open_device_comm(CommBackend::mpi, world), nullptr) << "mpi: the world itself";
}

}  // namespace
}  // namespace zshard
