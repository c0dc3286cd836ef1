// What the model tests share: random token batches and random parameters for a LocalParams context.
#pragma once
#include <cstdint>
#include <vector>

#include "models/local_params.h"

namespace zshard::test {

// B sequences of T random tokens below `vocab`, and as many random targets.
struct RandomTokens {
  std::vector<int32_t> inputs, targets;
  int B, T;
  RandomTokens(int b, int t, int vocab, uint64_t seed);
  Batch batch() const { return {inputs.data(), targets.data(), B, T}; }
};

// Every parameter N(0, std): larger than an init, so that every path of the model carries weight.
void randomize_params(LocalParams& ctx, double std, uint64_t seed);

// Backpropagates `data` through `model` in the f64 context `ctx` (whose grads start at zero), then compares
// every parameter element's gradient with the central difference (L(x+h) - L(x-h)) / 2h of the summed
// token loss: a gtest failure (naming the parameter) where max_rel_diff exceeds `tol`. Returns the worst.
double expect_gradients_match_finite_differences(Model& model, LocalParams& ctx, const RandomTokens& data,
                                                 double tol = 1e-6, double h = 1e-5);

}  // namespace zshard::test
