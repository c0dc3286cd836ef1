#include "tests/support/training_runs.h"

#include <cmath>

#include "comm/self_communicator.h"
#include "shard/sharded_params.h"

namespace zshard::test {

TrainOptions tiny_options(int steps) {
  TrainOptions o;
  o.model.name = "tiny";
  o.data.batch = 8;
  o.data.seq = 32;
  o.optimizer.steps = steps;
  o.optimizer.lr = 3e-3f;
  // GPT-2's key bias has an exactly zero true gradient (softmax ignores a constant shift of the scores),
  // so what backward computes for it is rounding noise, which differs with the order of any sum - and
  // sharding reorders sums. With eps 1e-8 Adam would turn that noise into full-size steps of random
  // sign; eps 1e-6 keeps the comparison about the strategies, not about amplified rounding.
  o.optimizer.eps = 1e-6f;
  o.optimizer.warmup = 3;
  o.optimizer.grad_clip = 1.0f;  // active: the tiny model's early gradient norms are above 1
  o.model.seed = 7;
  return o;
}

RunResult train(const TrainOptions& options, comm::Communicator& comm) {
  Trainer trainer(options, comm);
  trainer.run(nullptr);
  RunResult r;
  for (const auto& h : trainer.history()) {
    r.losses.push_back(h.loss);
    r.grad_norms.push_back(h.grad_norm);
    r.rank_batches.push_back(h.rank_batches);
    r.comm_bytes.push_back(h.comm_bytes);
    if (!std::isnan(h.eval_loss)) r.eval_losses.push_back(h.eval_loss);
  }
  for (int u = 0; u < trainer.engine().params().num_units(); ++u) {
    const std::vector<float> full = trainer.engine().params().full_unit_params(u);
    r.params.insert(r.params.end(), full.begin(), full.begin() + trainer.engine().params().layout(u).numel());
  }
  return r;
}

RunResult train_single_process(const TrainOptions& options) {
  comm::SelfCommunicator self;
  TrainOptions single = options;
  single.plan.strategy = StrategyOptions{};
  single.data.rank_batches.clear();
  single.data.rank_batches_auto = false;
  single.data.max_rank_batch.reset();
  single.data.rebalance_every.reset();
  return train(single, self);
}

}  // namespace zshard::test
