// What the model tests share: random token batches and random parameters for a LocalParams context.
#pragma once
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include <zshard/testing.h>

#include "models/lm_head.h"

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
// token loss: a gtest failure (naming the parameter) where max_rel_diff exceeds `tol`. Returns the worst. A
// frozen parameter (no gradient in `ctx`) is skipped.
double expect_gradients_match_finite_differences(Model& model, LocalParams& ctx, const RandomTokens& data,
                                                 double tol = 1e-6, double h = 1e-5);

// forward_backward on `data` without and then with Recompute::blocks, each in a fresh context
// of `dtype` holding `params`'s values: gtest failures unless the two losses, every gradient (memcmp) and
// the protocol calls (so the collectives) are the same. Leaves `model` without checkpointing.
void expect_recompute_bit_identical(Model& model, const LocalParams& params, DType dtype,
                                        const RandomTokens& data);

// A tied head's weight gradient added at the head and deferred to the embedding's backward (`set_head_gradient`
// sets the model's order): over two accumulated micro-steps of `data` in fresh contexts holding `params`'s
// values, gtest failures unless the losses and every gradient are the same bits, in f32 and f64, with and
// without checkpointing. Leaves `model` without checkpointing and the order by_tokens.
void expect_deferred_head_bit_identical(Model& model, const std::function<void(HeadGradient)>& set_head_gradient,
                                        const LocalParams& params, const RandomTokens& data);

// After a forward_backward on `data` in its order by_tokens, a gtest failure unless a model with a tied head
// first asks for unit 0's grads after every other unit's are ready (`deferred`), or before the final unit's.
void expect_tied_gradient_opens(Model& model, const RandomTokens& data, bool deferred);

// For each mode, the activations the cpu allocator holds after a forward_backward on `data` in f32 equal
// activation_bytes; blocks needs fewer. Returns {none, blocks} bytes.
std::pair<int64_t, int64_t> expect_recompute_shrinks_activations(Model& model, const RandomTokens& data);

// On a model that has not run yet: forward_backward on `data` with blocks and then with fused attention,
// with and without checkpointing, each in a fresh context of `dtype` holding `params`'s values: gtest
// failures unless the losses agree to `tol` relative, every gradient to `tol` (max_rel_diff), the protocol
// calls (so the collectives) are the same, and the activations the cpu allocator holds equal
// activation_bytes, fewer with fused. Leaves `model` on blocks without checkpointing.
void expect_fused_attention_matches_blocks(Model& model, const LocalParams& params, DType dtype,
                                           const RandomTokens& data, double tol);

}  // namespace zshard::test
