// The ParamContext protocol is checked on every strategy, ddp and zero1 included (where a second
// grads_ready would issue a second all-reduce and a forgotten one would leave the gradients silently
// unreduced): each misuse is an error naming the unit, raised before any collective, on every rank alike.
// zshard-test-np: 1 2 4
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>

#include "models/gpt2.h"
#include "shard/sharded_params.h"
#include "tests/support/test_support.h"

namespace zshard {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

const GPT2& model() {
  static const GPT2 m(gpt2_config("tiny"));
  return m;
}

// Every strategy the world can host; hybrid with groups of 2 where the world divides, else of 1.
std::vector<StrategyOptions> strategies() {
  const int n = test::world().size();
  std::vector<StrategyOptions> out;
  for (StrategyKind k : {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2, StrategyKind::zero3})
    out.push_back({k, {}, true, 2});
  out.push_back({StrategyKind::hybrid, ShardGroupRequest::equal(n % 2 == 0 ? 2 : 1), true, 2});
  return out;
}

// Runs `misuse` inside one micro-step of a fresh ShardedParams and returns the error it raised.
std::string error_in_micro_step(const StrategyOptions& s, const std::function<void(ShardedParams&)>& misuse) {
  auto p = std::make_unique<ShardedParams>(model(), test::world(), test::plan(s), 1);
  p->begin_micro_step(true);
  const std::string error = test::error_of([&] {
    misuse(*p);
    p->end_micro_step();
  });
  // A failed micro-step leaves collectives in an undefined state: the object is dropped, not reused.
  (void)p.release();
  return error;
}

TEST(ParamProtocol, EachMisuseNamesTheUnitOnEveryStrategy) {
  const int last = model().num_units() - 1;  // ln_f
  for (const StrategyOptions& s : strategies()) {
    SCOPED_TRACE(strategy_name(s.kind));
    EXPECT_THAT(error_in_micro_step(s,
                                    [&](ShardedParams& p) {
                                      p.grads(last);
                                      p.grads_ready(last);
                                      p.grads_ready(last);
                                    }),
                StartsWith("grads_ready for unit ln_f twice in one micro-step"));
    EXPECT_THAT(error_in_micro_step(s, [&](ShardedParams& p) { p.grads(last); }),
                StartsWith("unit ln_f: grads() without grads_ready() in this micro-step"));
    EXPECT_THAT(error_in_micro_step(s, [&](ShardedParams& p) { p.release(last); }),
                StartsWith("release of unit ln_f that is not gathered"));
    EXPECT_THAT(error_in_micro_step(s, [&](ShardedParams& p) { p.gather(last); }),
                StartsWith("unit ln_f still gathered at the end of a micro-step"));
    EXPECT_THAT(error_in_micro_step(s, [&](ShardedParams& p) { p.grads_ready(last); }),
                StartsWith("grads_ready for unit ln_f without grads()"));
    // Every unit but ln_f hands back its gradients: ln_f would not train.
    EXPECT_THAT(error_in_micro_step(s,
                                    [&](ShardedParams& p) {
                                      for (int u = last - 1; u >= 0; --u) {
                                        p.grads(u);
                                        p.grads_ready(u);
                                      }
                                    }),
                HasSubstr("unit ln_f: no grads_ready() in this micro-step's backward"));
  }
}

// The legal uses: a unit gathered twice at once (a tied head), grads() several times before grads_ready,
// and accumulation over two micro-steps with the reduction only on the last.
TEST(ParamProtocol, LegalSequencesPassOnEveryStrategy) {
  for (const StrategyOptions& s : strategies()) {
    SCOPED_TRACE(strategy_name(s.kind));
    ShardedParams p(model(), test::world(), test::plan(s), 1);
    for (int micro = 0; micro < 2; ++micro) {
      p.begin_micro_step(micro == 1);
      EXPECT_EQ(test::error_of([&] {
                  p.gather(0);
                  p.gather(0);
                  p.release(0);
                  p.release(0);
                  for (int u = model().num_units() - 1; u >= 0; --u) {
                    p.gather(u);
                    p.grads(u);
                    p.grads(u);
                    p.release(u);
                    p.grads_ready(u);
                  }
                  p.end_micro_step();
                }),
                "(no error)");
    }
  }
}

}  // namespace
}  // namespace zshard
