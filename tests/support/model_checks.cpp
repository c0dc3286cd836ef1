#include "tests/support/model_checks.h"

#include <algorithm>
#include <random>

#include <gtest/gtest.h>

#include "tests/support/test_support.h"

namespace zshard::test {

RandomTokens::RandomTokens(int b, int t, int vocab, uint64_t seed) : B(b), T(t) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  for (int i = 0; i < b * t; ++i) inputs.push_back(token(rng));
  for (int i = 0; i < b * t; ++i) targets.push_back(token(rng));
}

void randomize_params(LocalParams& ctx, double std, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, std);
  for (int u = 0; u < ctx.num_units(); ++u)
    for (const Tensor& p : ctx.param_tensors(u)) {
      std::vector<double> values(size_t(p.numel()));
      for (double& v : values) v = normal(rng);
      assign_doubles(p, values);
    }
}

double expect_gradients_match_finite_differences(Model& model, LocalParams& ctx, const RandomTokens& data,
                                                 double tol, double h) {
  model.forward_backward(ctx, data.batch(), 1.0f);
  const std::vector<UnitSpec> units = model.units();
  double worst = 0;
  for (int u = 0; u < ctx.num_units(); ++u)
    for (size_t i = 0; i < units[u].params.size(); ++i) {
      double* x = ctx.param_tensors(u)[i].data<double>();
      std::vector<double> numeric(size_t(units[u].params[i].numel()));
      for (size_t j = 0; j < numeric.size(); ++j) {
        const double saved = x[j];
        x[j] = saved + h;
        const double plus = model.forward(ctx, data.batch());
        x[j] = saved - h;
        const double minus = model.forward(ctx, data.batch());
        x[j] = saved;
        numeric[j] = (plus - minus) / (2 * h);
      }
      const double err = max_rel_diff(to_doubles(ctx.grad_tensors(u)[i]), numeric);
      EXPECT_LE(err, tol) << units[u].params[i].name;
      worst = std::max(worst, err);
    }
  return worst;
}

}  // namespace zshard::test
