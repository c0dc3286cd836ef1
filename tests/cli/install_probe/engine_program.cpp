// A training program of one's own on the core library alone: the public engine and model headers,
// linked to zshard::core (test_install_example.sh runs it and checks it needs nothing of the tools).
#include <cstdio>
#include <vector>

#include <zshard/engine.h>
#include <zshard/model_registry.h>
#include <zshard/world.h>

int main(int argc, char** argv) {
  zshard::World world(&argc, &argv);
  const auto model = zshard::build_model("tiny", zshard::model_config("tiny"));
  const zshard::ShardPlan plan = zshard::resolve_plan({.strategy = {zshard::StrategyKind::zero3}}, world.comm());
  constexpr int B = 2, T = 16;
  zshard::Engine engine(*model, world.comm(), plan, {.grad_accum = 1, .tokens_per_step = B * T});
  std::vector<int32_t> tokens(B * T + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i * 7 % 256);
  double first = 0, last = 0;
  for (int step = 0; step < 5; ++step) {
    const double loss = engine.forward_backward({tokens.data(), tokens.data() + 1, B, T}) / (B * T);
    engine.step({.lr = 1e-2f});
    (step == 0 ? first : last) = loss;
  }
  std::printf("loss %.4f -> %.4f\n", first, last);
  return last < first ? 0 : 1;
}
