// GroupComms: the communicators a strategy reduces over, split from the world by its ShardGroups.
//
//   shard    this rank's shard group: all-gathers parameters, reduce-scatters gradients.
//   across   the all-reduce of this rank's gradient shard across the groups (the replicas). Groups of one
//            size hold the same shards, so that is one communicator: the ranks with this shard index.
//            Unequal groups (4 + 2) cut a unit at different places; the unit is then seen as the common
//            refinement of every group's shard boundaries, and each of its pieces is all-reduced among
//            the ranks that own it, one per group. A rank of the group of 2 owns two pieces of a group of
//            4's shards, so it reduces with two peers in turn.
//   secondary  zero3 with secondary groups (ShardPlan::secondary_groups): this rank's, which backward's
//            gathers run in.
//
// Every rank issues its pieces in offset order, and units in the order the program reduces them, so the
// collectives of all piece communicators follow one global order: NCCL cannot deadlock on communicators
// whose members issue them in different orders.
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include <zshard/communicator.h>
#include <zshard/plan.h>

namespace zshard {

class GroupComms {
 public:
  // Collective over `world`, which must outlive this object (the gradient norm reduces over it).
  GroupComms(comm::Communicator& world, const ShardGroups& groups,
             const std::optional<ShardGroups>& secondary_groups = std::nullopt);

  const ShardGroups& groups() const { return groups_; }
  int shard_index() const { return shard_->rank(); }
  int shard_group_size() const { return shard_->size(); }
  comm::Communicator& shard() { return *shard_; }
  comm::Communicator* secondary() { return secondary_.get(); }  // null without secondary groups
  // Two or more groups: a shard's reduction does not end inside its group.
  bool across_groups() const { return groups_.count() > 1; }

  // Sums this rank's shard (shard_numel elements of a unit padded to groups().pad_multiple()) across the
  // groups, in place: every piece's owners end with the same bits. Null when nothing crosses groups.
  comm::WorkPtr all_reduce_across_groups(void* shard, int64_t shard_numel, DType dtype);

  // *sum := the sum over the world of one value that every rank of a group holds a part of, computed alike
  // on every rank: the shard group's parts for equal groups (replicas hold the same parts), else the first
  // group's (unequal groups round differently, and every rank must clip alike), added in rank order.
  // `part` and `sum` are doubles on `device`, the run's, and `gathered` room for a part of every rank there:
  // the communicators take them as they are, so the host never reads them.
  void sum_of_partition(Device device, const double* part, double* gathered, double* sum);

  comm::CommStats stats() const;  // every communicator above, this rank's bytes
  void reset_stats();

 private:
  struct Piece {
    std::unique_ptr<comm::Communicator> comm;  // the owners, one rank per group
    int slot_begin, slot_end;                  // within this rank's shard, in slots of padded / pad_multiple
  };

  comm::Communicator& world_;
  ShardGroups groups_;
  std::unique_ptr<comm::Communicator> shard_;
  std::unique_ptr<comm::Communicator> secondary_;
  std::vector<Piece> pieces_;  // this rank's, in offset order
};

}  // namespace zshard
