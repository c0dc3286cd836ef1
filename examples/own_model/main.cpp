// A model of one's own on the zshard runtime: a two-unit next-token model (an embedding table, then a
// linear head) trained with any strategy. The model only talks to ParamContext; ShardedParams does the
// sharding. Run plainly, or under mpirun with a strategy name as the first argument.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "comm/launch.h"
#include "kernels/cpu/ops.h"
#include "runtime/sharded_params.h"

using namespace zshard;

class TinyBigram final : public Model {
 public:
  TinyBigram(int vocab, int dim) : V_(vocab), C_(dim) {}

  std::vector<UnitSpec> units() const override {
    return {{"embed", {{"wte", {V_, C_}, true}}},
            {"head", {{"head.weight", {C_, V_}, true}, {"head.bias", {V_}, false}}}};
  }

  void init_unit(int unit, const UnitTensors& params, uint64_t seed) const override {
    uint64_t state = seed * 2654435761u + unit;
    for (const Tensor& t : params) {
      float* p = t.data<float>();
      for (int64_t i = 0; i < t.numel(); ++i) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = t.shape().size() == 2 ? 0.1f * (float((state >> 40) % 2001) / 1000.0f - 1.0f) : 0.0f;
      }
    }
  }

  double forward_backward(ParamContext& ctx, const Batch& b, float loss_scale) override {
    return run(ctx, b, loss_scale, /*backward=*/true);
  }

  double forward(ParamContext& ctx, const Batch& b) override { return run(ctx, b, 0.0f, false); }

  int64_t activation_bytes(int B, int T, DType) const override {
    return int64_t(B) * T * (2 * C_ + V_ + 1) * 4;
  }

 private:
  double run(ParamContext& ctx, const Batch& b, float loss_scale, bool backward) {
    const int N = b.B * b.T;
    std::vector<float> x(size_t(N) * C_), logits(size_t(N) * V_), losses(N), dx(size_t(N) * C_, 0.0f);
    const UnitTensors& emb = ctx.gather(0);
    for (int i = 0; i < N; ++i)
      for (int c = 0; c < C_; ++c) x[size_t(i) * C_ + c] = emb[0].data<float>()[size_t(b.inputs[i]) * C_ + c];
    ctx.release(0);

    const UnitTensors& head = ctx.gather(1);
    cpu::linear_forward(logits.data(), x.data(), head[0].data<float>(), head[1].data<float>(), N, C_, V_);
    const double loss = cpu::cross_entropy_forward_backward(backward ? logits.data() : nullptr, losses.data(),
                                                            logits.data(), b.targets, N, V_, V_, loss_scale);
    if (!backward) {
      ctx.release(1);
      return loss;
    }
    const UnitTensors& dhead = ctx.grads(1);
    cpu::linear_backward(dx.data(), dhead[0].data<float>(), dhead[1].data<float>(), logits.data(), x.data(),
                         head[0].data<float>(), N, C_, V_);
    ctx.release(1);
    ctx.grads_ready(1);

    float* dwte = ctx.grads(0)[0].data<float>();  // the embedding backward needs no parameters
    for (int i = 0; i < N; ++i)
      for (int c = 0; c < C_; ++c) dwte[size_t(b.inputs[i]) * C_ + c] += dx[size_t(i) * C_ + c];
    ctx.grads_ready(0);
    return loss;
  }

  int64_t V_, C_;
};

int main(int argc, char** argv) {
  auto world = comm::init_world(&argc, &argv);
  StrategyOptions strategy;
  strategy.kind = parse_strategy(argc > 1 ? argv[1] : "zero3");
  TinyBigram model(32, 16);
  ShardedParams params(model, *world, strategy, /*seed=*/1);

  // The rule to learn: the next token is (3 * token + 1) mod 32. Every rank takes its own sequences.
  const int B = 4, T = 16;
  std::vector<int32_t> inputs(B * T), targets(B * T);
  double first = 0, last = 0;
  for (int step = 1; step <= 200; ++step) {
    for (int i = 0; i < B * T; ++i) {
      inputs[i] = (step * 7 + i * 5 + world->rank() * 11) % 32;
      targets[i] = (3 * inputs[i] + 1) % 32;
    }
    params.begin_micro_step(true);
    const double global_tokens = double(B) * T * world->size();
    double loss = model.forward_backward(params, {inputs.data(), targets.data(), B, T}, float(1.0 / global_tokens));
    params.end_micro_step();
    params.grad_norm();
    params.optimizer_step({0.05f, 0.9f, 0.95f, 1e-8f, 0.0f, step, 1.0f});
    comm::all_reduce_sum(*world, &loss, 1);
    last = loss / global_tokens;
    if (step == 1) first = last;
  }
  if (world->rank() == 0) std::printf("own model (%s): loss %.4f -> %.4f\n", argc > 1 ? argv[1] : "zero3", first, last);
  const bool learned = last < 0.5 * first;
  world.reset();
  comm::finalize_world();
  return learned ? 0 : 1;
}
