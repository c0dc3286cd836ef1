#include "shard/group_comms.h"

#include <algorithm>
#include <set>

#include "comm/flight_recorder/recorder.h"
#include "kernels/engine_ops.h"

namespace zshard {

namespace {

// Several pieces' collectives as one operation: done when all are.
class WorkList final : public comm::Work {
 public:
  explicit WorkList(std::vector<comm::WorkPtr> works) : works_(std::move(works)) {}
  bool test() override {
    bool done = true;
    for (auto& w : works_) done = w->test() && done;  // tests every one: MPI progresses what it is asked
    return done;
  }
  void wait(comm::Clock::time_point deadline) override {
    for (auto& w : works_) w->wait(deadline);
  }

 private:
  std::vector<comm::WorkPtr> works_;
};

// One piece of the common refinement: slots [begin, end) of the padded unit and its owner in each group.
struct RefinedPiece {
  int begin, end;
  std::vector<int> owners;
};

std::vector<RefinedPiece> common_refinement(const ShardGroups& groups) {
  const int slots = groups.pad_multiple();
  std::set<int> cuts;
  for (int g = 0; g < groups.count(); ++g)
    for (int s = 0; s <= groups.size(g); ++s) cuts.insert(s * (slots / groups.size(g)));
  std::vector<RefinedPiece> pieces;
  for (auto it = cuts.begin(); std::next(it) != cuts.end(); ++it) {
    RefinedPiece p{*it, *std::next(it), {}};
    for (int g = 0; g < groups.count(); ++g)
      p.owners.push_back(groups.first_rank(g) + p.begin / (slots / groups.size(g)));
    pieces.push_back(std::move(p));
  }
  return pieces;
}

}  // namespace

GroupComms::GroupComms(comm::Communicator& world, const ShardGroups& groups,
                       const std::optional<ShardGroups>& secondary_groups)
    : world_(world), groups_(groups) {
  ZS_CHECK(groups.world_size() == world.size(), "shard groups of ", groups.world_size(), " ranks on a world of ",
           world.size());
  const int rank = world.rank(), group = groups.group_of(rank);
  shard_ = world.split(group, rank);
  comm::set_group_label(*shard_, "shard group " + std::to_string(group));
  if (secondary_groups) {
    ZS_CHECK(secondary_groups->world_size() == world.size(), "secondary groups of ", secondary_groups->world_size(),
             " ranks on a world of ", world.size());
    const int secondary = secondary_groups->group_of(rank);
    secondary_ = world.split(secondary, rank);
    comm::set_group_label(*secondary_, "secondary group " + std::to_string(secondary));
  }
  if (!across_groups()) return;
  const int my_first_slot = (rank - groups.first_rank(group)) * (groups.pad_multiple() / groups.size(group));
  // Each split makes the communicators of pieces whose owners are disjoint (a rank is in at most one), so
  // groups of one size need a single split: the ranks of each shard index.
  std::vector<RefinedPiece> left = common_refinement(groups);
  while (!left.empty()) {
    std::vector<RefinedPiece> round, later;
    std::set<int> busy;
    for (RefinedPiece& p : left) {
      const bool free = std::none_of(p.owners.begin(), p.owners.end(), [&](int r) { return busy.count(r); });
      if (free) busy.insert(p.owners.begin(), p.owners.end());
      (free ? round : later).push_back(std::move(p));
    }
    int color = int(round.size()) + rank;  // a piece of its own, dropped, where this rank owns none
    const RefinedPiece* mine = nullptr;
    for (size_t i = 0; i < round.size(); ++i)
      if (std::count(round[i].owners.begin(), round[i].owners.end(), rank)) {
        color = int(i);
        mine = &round[i];
      }
    std::unique_ptr<comm::Communicator> comm = world.split(color, rank);
    // Named by the slots the piece covers, which its owners share (their shard indices may differ).
    if (mine)
      comm::set_group_label(*comm, mine->end - mine->begin == 1
                                       ? detail::concat("replicas of slot ", mine->begin)
                                       : detail::concat("replicas of slots ", mine->begin, "-", mine->end - 1));
    if (mine) pieces_.push_back({std::move(comm), mine->begin - my_first_slot, mine->end - my_first_slot});
    left = std::move(later);
  }
  std::sort(pieces_.begin(), pieces_.end(), [](const Piece& a, const Piece& b) { return a.slot_begin < b.slot_begin; });
}

comm::WorkPtr GroupComms::all_reduce_across_groups(void* shard, int64_t shard_numel, DType dtype) {
  if (!across_groups()) return nullptr;
  if (pieces_.size() == 1)  // the whole shard: groups of one size
    return pieces_[0].comm->all_reduce(shard, size_t(shard_numel), dtype, comm::ReduceOp::sum);
  const int64_t slot = shard_numel / (groups_.pad_multiple() / shard_group_size());
  std::vector<comm::WorkPtr> works;
  for (const Piece& p : pieces_)
    works.push_back(p.comm->all_reduce(static_cast<char*>(shard) + p.slot_begin * slot * dtype_size(dtype),
                                       size_t((p.slot_end - p.slot_begin) * slot), dtype, comm::ReduceOp::sum));
  // Its wait() without a deadline is the pieces' communicators' (--comm-timeout), not Work's default.
  auto list = std::make_unique<WorkList>(std::move(works));
  list->set_default_deadline(pieces_[0].comm->timeout(), "all_reduce across unequal shard groups");
  return list;
}

void GroupComms::sum_of_partition(Device device, const double* part, double* gathered, double* sum) {
  comm::Communicator& holders = groups_.equal() ? *shard_ : world_;
  const size_t parts = size_t(groups_.equal() ? shard_->size() : groups_.size(0));
  if (holders.size() > 1) holders.all_gather(part, gathered, 1, DType::f64)->wait();
  ops::sum_in_order(device, sum, holders.size() > 1 ? gathered : part, parts);
}

comm::CommStats GroupComms::stats() const {
  comm::CommStats total;
  const auto add = [&](comm::Communicator& c) {
    c.collect_device_stats();
    for (int k = 0; k < comm::kNumCollectives; ++k) {
      total.bytes[k] += c.stats().bytes[k];
      total.calls[k] += c.stats().calls[k];
    }
    total.seconds_waiting += c.stats().seconds_waiting;
  };
  add(*shard_);
  if (secondary_) add(*secondary_);
  for (const Piece& p : pieces_) add(*p.comm);
  return total;
}

void GroupComms::reset_stats() {
  shard_->reset_stats();
  if (secondary_) secondary_->reset_stats();
  for (Piece& p : pieces_) p.comm->reset_stats();
}

}  // namespace zshard
