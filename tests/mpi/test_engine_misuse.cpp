// What a training loop of one's own can get wrong around the Engine, each refused with a line that says
// what went wrong, before anything is updated and with nothing lost: a model that declares duplicate
// names, names no weights file can hold, negative shapes, or other units on another rank; a batch without
// targets (refused on the rank that passes it); a tokens_per_step that is not the ranks' tokens; AdamW
// hyper-parameters out of range; a step before its micro-steps; a save over a committed checkpoint. A load
// drops the step in progress, as does a model that throws partway, and a unit of no elements trains under
// every strategy.
// zshard-test-np: 1 2
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include <zshard/engine.h>
#include <zshard/ops.h>

#include "comm/self_communicator.h"
#include "models/gpt2.h"
#include "tests/support/test_support.h"

namespace zshard {
namespace {

using ::testing::HasSubstr;
using test::error_of;
using test::world;

constexpr int kB = 2, kT = 8;

GPT2& model() { return test::tiny_gpt2(); }

ShardPlan zero3() { return test::plan({StrategyKind::zero3}); }

// This rank's micro-batch: the same tokens on every rank, which the mean does not mind.
struct Tokens {
  std::vector<int32_t> inputs, targets;
  Tokens() {
    for (int i = 0; i < kB * kT; ++i) {
      inputs.push_back((7 * i + 3) % 256);
      targets.push_back((7 * i + 10) % 256);
    }
  }
  Batch batch() const { return {inputs.data(), targets.data(), kB, kT}; }
};

EngineOptions options(int64_t tokens_per_step = int64_t(kB) * kT * world().size()) {
  return {.seed = 3, .grad_accum = 1, .tokens_per_step = tokens_per_step};
}

// The summed loss of an evaluation pass: unchanged exactly when the parameters are.
double eval_loss(Engine& engine, const Tokens& tokens) { return engine.forward(tokens.batch()); }

// A model that declares the units it is given: only constructed, never run.
class DeclaredUnits final : public Model {
 public:
  explicit DeclaredUnits(std::vector<UnitSpec> units) : units_(std::move(units)) {}
  std::vector<UnitSpec> units() const override { return units_; }
  void init_unit(int, const UnitTensors&, uint64_t) const override {}
  double forward_backward(ParamContext&, const Batch&, float) override { return 0; }
  double forward(ParamContext&, const Batch&) override { return 0; }
  int64_t activation_bytes(int, int, DType) const override { return 0; }
  int vocab_size() const override { return 16; }
  int context_length() const override { return 16; }

 private:
  std::vector<UnitSpec> units_;
};

std::string construction_error(std::vector<UnitSpec> units) {
  DeclaredUnits declared(std::move(units));
  return error_of([&] { Engine engine(declared, world(), zero3(), options()); });
}

// Unit names key a checkpoint's tensors and parameter names a weights file's: a duplicate used to fail
// only at the first save, after the training it was to keep.
TEST(EngineMisuse, DuplicateNamesAndNegativeShapesAreRefusedAtConstruction) {
  const ParamSpec w{"w", {4}, true}, v{"v", {4}, true};
  EXPECT_EQ(construction_error({{"layer", {w}}, {"layer", {v}}}),
            "model units 0 and 1 are both named 'layer'; a unit's name must be unique");
  EXPECT_EQ(construction_error({{"a", {w}}, {"b", {v, w}}}),
            "parameter 'w' is given twice (units 'a' and 'b'); a parameter's name must be unique in the model");
  EXPECT_EQ(construction_error({{"a", {w, {"neg", {2, -4}, false}}}}),
            "unit 'a', parameter 'neg': shape (2, -4) has a negative dimension");
  // A count that wraps trained the parameter as one of no elements, silently.
  EXPECT_EQ(construction_error({{"a", {w, {"huge", {int64_t(1) << 62, 8}, false}}}}),
            "unit 'a', parameter 'huge': shape (4611686018427387904, 8) has more elements than a 64-bit count holds");
  EXPECT_EQ(construction_error({}), "the model declares no parameters (its units() lists none with elements): nothing to train");
  EXPECT_EQ(construction_error({{"a", {w}}, {"b", {v}}}), "(no error)");
}

// The options a loop passes are usage errors naming the field, not internal checks; an export of adapters
// the model lacks wrote an empty file.
TEST(EngineMisuse, EngineOptionsOutOfRangeAndAnAdapterExportWithoutAdaptersAreUsageErrors) {
  EXPECT_THROW(Engine(model(), world(), zero3(), {.grad_accum = 0, .tokens_per_step = 16}), UsageError);
  EXPECT_EQ(error_of([] { Engine(model(), world(), zero3(), {.grad_accum = 0, .tokens_per_step = 16}); }),
            "EngineOptions::grad_accum must be >= 1, got 0");
  EXPECT_EQ(error_of([] { Engine(model(), world(), zero3(), {.grad_accum = 1, .tokens_per_step = 0}); }),
            "EngineOptions::tokens_per_step must be >= 1, got 0");
  Engine engine(model(), world(), zero3(), options());
  EXPECT_EQ(error_of([&] { engine.export_adapters("unwritten.safetensors"); }),
            "export_adapters(unwritten.safetensors): the model has no LoRA adapters (export_weights writes its weights)");
  EXPECT_FALSE(std::filesystem::exists("unwritten.safetensors"));
  if (world().size() < 2) return;
  comm::SelfCommunicator self;
  const ShardPlan for_one = resolve_plan({}, self);
  EXPECT_EQ(error_of([&] { Engine(model(), world(), for_one, options()); }),
            detail::concat("Engine: the plan is for 1 rank(s) (resolve_plan's world), the world has ", world().size()));
}

// A weights file keys its tensors by name, and its header keeps "__metadata__" for itself.
TEST(EngineMisuse, NamesNoWeightsFileCanHoldAreRefusedAtConstruction) {
  EXPECT_EQ(construction_error({{"a", {{"", {4}, true}}}}),
            "unit 'a': a parameter named '', which no weights file can hold");
  EXPECT_EQ(construction_error({{"a", {{"__metadata__", {4}, true}}}}),
            "unit 'a': a parameter named '__metadata__', which no weights file can hold");
}

// Units of other sizes on another rank had the collectives exchange buffers of other sizes: a truncated
// message, a corrupted heap. Every rank now learns which unit differs, before anything is allocated.
TEST(EngineMisuse, UnitsThatDifferAcrossRanksAreRefusedAtConstruction) {
  if (world().size() < 2) GTEST_SKIP() << "needs two ranks";
  const int r = world().rank();
  EXPECT_THAT(construction_error({{"a", {{"w", {4}, true}}}, {"b", {{"v", {4 + r}, true}}}}),
              HasSubstr("the model's unit 1 ('b' on rank " + std::to_string(r) +
                        ") differs between ranks 0 and 1: every rank must build the same model"));
  std::vector<UnitSpec> units = {{"a", {{"w", {4}, true}}}};
  if (r == 1) units.push_back({"b", {{"v", {4}, true}}});
  EXPECT_THAT(construction_error(units), HasSubstr("the model has 1 unit(s) on rank 0 and 2 on rank 1"));
}

// A table of next-token logits beside a unit whose one trainable parameter holds no element, which the
// model gathers and makes ready like any other.
class TableBesideAnEmptyUnit final : public Model {
 public:
  static constexpr int V = 16;
  std::vector<UnitSpec> units() const override { return {{"table", {{"w", {V, V}, true}}}, {"empty", {{"z", {0, 4}, true}}}}; }
  void init_unit(int, const UnitTensors& params, uint64_t) const override {
    for (const Tensor& t : params)
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = 0.01f * float(i % 7);
  }
  double forward_backward(ParamContext& ctx, const Batch& b, float loss_scale) override {
    const int N = b.B * b.T;
    const Tensor logits = Tensor::zeros({N, V}, DType::f32, ctx.device(), Category::activations);
    const Tensor losses = Tensor::zeros({N}, DType::f32, ctx.device(), Category::activations);
    const float* w = ctx.gather(0)[0].data<float>();
    float* lg = logits.data<float>();
    for (int i = 0; i < N; ++i)
      for (int v = 0; v < V; ++v) lg[i * V + v] = w[b.inputs[i] * V + v];
    ctx.gather(1);
    ctx.release(1);
    const double loss =
        ops::cross_entropy_forward_backward(ctx.device(), lg, losses.data<float>(), lg, b.targets, N, V, V, loss_scale);
    ctx.release(0);
    float* g = ctx.grads(0)[0].data<float>();
    for (int i = 0; i < N; ++i)
      for (int v = 0; v < V; ++v) g[b.inputs[i] * V + v] += lg[i * V + v];
    ctx.grads_ready(0);
    ctx.grads(1);  // no element: nothing to accumulate
    ctx.grads_ready(1);
    return loss;
  }
  double forward(ParamContext&, const Batch&) override { return 0; }
  int64_t activation_bytes(int B, int T, DType) const override { return int64_t(B) * T * (V + 1) * 4; }
  int vocab_size() const override { return V; }
  int context_length() const override { return kT; }
};

// Such a unit has nothing to shard, reduce or step: the sharded strategies crashed in grads().
TEST(EngineMisuse, AUnitOfNoElementsTrainsUnderEveryStrategy) {
  TableBesideAnEmptyUnit table;
  std::vector<int32_t> tokens(kB * kT + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(5 * i + 3) % TableBesideAnEmptyUnit::V;
  std::vector<double> first;
  for (StrategyKind kind : {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2, StrategyKind::zero3}) {
    SCOPED_TRACE(strategy_name(kind));
    Engine engine(table, world(), test::plan({kind}), options());
    std::vector<double> losses;
    for (int step = 0; step < 3; ++step) {
      engine.forward_backward({tokens.data(), tokens.data() + 1, kB, kT});
      losses.push_back(engine.step({.lr = 0.1f}).loss);
    }
    if (first.empty()) first = losses;
    for (size_t s = 0; s < losses.size(); ++s) EXPECT_NEAR(losses[s], first[s], 1e-6 * first[s]) << "step " << s + 1;
    EXPECT_LT(losses.back(), losses.front()) << "it trains";
  }
}

TEST(EngineMisuse, ABatchWithoutTargetsOrInputsIsRefused) {
  const Tokens tokens;
  Engine engine(model(), world(), zero3(), options());
  EXPECT_EQ(error_of([&] { engine.forward_backward({tokens.inputs.data(), nullptr, kB, kT}); }),
            "forward_backward: a batch of B = 2, T = 8 without targets");
  EXPECT_EQ(error_of([&] { engine.forward({nullptr, tokens.targets.data(), kB, kT}); }),
            "forward: a batch of B = 2, T = 8 without inputs");
  EXPECT_EQ(error_of([&] { engine.forward_backward({nullptr, nullptr, -1, kT}); }),
            "forward_backward: a batch of B = -1, T = 8 (negative)");
  // Nothing was started: the engine goes on.
  engine.forward_backward(tokens.batch());
  EXPECT_EQ(error_of([&] { engine.step({}); }), "(no error)");
}

// Every rank passing the whole batch where the ranks were to share it doubled the gradient, silently.
TEST(EngineMisuse, ATokensPerStepThatIsNotTheRanksTokensStopsTheStep) {
  const Tokens tokens;
  const int64_t held = int64_t(kB) * kT * world().size();
  Engine engine(model(), world(), zero3(), options(held * 2));
  const double before = eval_loss(engine, tokens);
  engine.forward_backward(tokens.batch());
  EXPECT_THAT(error_of([&] { engine.step({}); }),
              HasSubstr("step 1: the ranks' micro-batches held " + std::to_string(held) +
                        " tokens (B x T summed over ranks and micro-steps), but EngineOptions::tokens_per_step is " +
                        std::to_string(held * 2) + ": the gradient would not be their mean"));
  EXPECT_EQ(eval_loss(engine, tokens), before) << "stopped before the optimizer step";
  EXPECT_EQ(engine.steps_done(), 0);
  // The step was dropped: the next batch starts a new one, which the same count stops again.
  EXPECT_EQ(error_of([&] { engine.forward_backward(tokens.batch()); }), "(no error)");
  EXPECT_THAT(error_of([&] { engine.grad_norm(); }), HasSubstr("step 1: the ranks' micro-batches held"));
  EXPECT_EQ(error_of([&] { engine.forward_backward(tokens.batch()); }), "(no error)");
}

TEST(EngineMisuse, AdamWOutOfRangeIsRefusedBeforeAnyUpdate) {
  const Tokens tokens;
  Engine engine(model(), world(), zero3(), options());
  const double before = eval_loss(engine, tokens);
  engine.forward_backward(tokens.batch());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(engine.step({.lr = nan}), UsageError);
  EXPECT_EQ(error_of([&] { engine.step({.lr = nan}); }), "step: AdamW::lr = nan is not finite and >= 0");
  EXPECT_EQ(error_of([&] { engine.step({.lr = -1}); }), "step: AdamW::lr = -1 is not finite and >= 0");
  EXPECT_EQ(error_of([&] { engine.step({.beta1 = 1}); }), "step: AdamW::beta1 = 1 is not in [0, 1)");
  EXPECT_EQ(error_of([&] { engine.step({.eps = 0}); }), "step: AdamW::eps = 0 is not finite and > 0");
  EXPECT_EQ(error_of([&] { engine.step({.grad_clip = -1}); }),
            "step: AdamW::grad_clip = -1 is not finite and >= 0 (0: no clipping)");
  EXPECT_EQ(eval_loss(engine, tokens), before);
  // Refused before the step's collectives: the step itself is still to be taken.
  EXPECT_EQ(error_of([&] { engine.step({.lr = 1e-2f}); }), "(no error)");
  EXPECT_NE(eval_loss(engine, tokens), before);
}

// A step-N directory is step N's: the newest-checkpoint search goes by the name, and a load of another
// step's manifest there is refused as damaged.
TEST(EngineMisuse, ASaveIntoAnotherStepsDirectoryIsRefused) {
  test::TempDir tmp;
  const std::string root = test::shared_dir(tmp);
  Engine engine(model(), world(), zero3(), options());
  const std::string refused = error_of([&] { engine.save(root + "/step-00000005"); });
  // Agreed: rank 0 names it, the others hold "another rank failed".
  EXPECT_THAT(refused, HasSubstr(world().rank() == 0 ? "step-00000005: named for step 5, but the state is of step 0"
                                                     : "another rank failed"));
  EXPECT_EQ(error_of([&] { engine.save(root + "/step-00000000"); }), "(no error)");
  EXPECT_EQ(engine.load(root + "/step-00000000").step, 0);
}

// A loop of one's own gets the trainer's refusal: groups of one carry no quantized traffic.
TEST(EngineMisuse, QuantizationGroupsOfOneCannotCarryIsRefused) {
  StrategyOptions hybrid{StrategyKind::hybrid, ShardGroupRequest::equal(1)};
  hybrid.quantize_reductions = ReductionQuantization::int8;
  EXPECT_THAT(error_of([&] { Engine engine(model(), world(), test::plan(hybrid), options()); }),
              HasSubstr(" int8: every shard group here is one rank"));
}

TEST(EngineMisuse, AStepBeforeItsMicroStepsSaysWhatToCall) {
  Engine engine(model(), world(), zero3(), options());
  const std::string want =
      "grad_norm() or step() after 0 of the step's 1 forward_backward call(s) (EngineOptions::grad_accum): "
      "call forward_backward first";
  EXPECT_EQ(error_of([&] { engine.step({}); }), want);
  EXPECT_EQ(error_of([&] { engine.grad_norm(); }), want);
}

// A load in the middle of a step used to leave the step's gradient to be applied to the loaded state: it
// drops the step, so that a loop recovering from a failed step loads the last checkpoint and goes on. With
// the optimizer offloaded the step's gradients are on their way to the host once its micro-steps end: the
// load drops them before it replaces any state (it used to refuse halfway, the state half loaded).
TEST(EngineMisuse, ALoadDropsTheStepInProgress) {
  for (const Placement& placement : {Placement{}, Placement{.offload_optimizer = true}}) {
    SCOPED_TRACE(placement.offload_optimizer ? "offloaded" : "on the device");
    const ShardPlan plan = test::plan({StrategyKind::zero3}, placement);
    test::TempDir tmp;
    const std::string dir = test::shared_dir(tmp) + "/ck";
    const Tokens tokens;
    Engine engine(model(), world(), plan, options());
    engine.save(dir);
    engine.forward_backward(tokens.batch());
    EXPECT_EQ(error_of([&] { EXPECT_EQ(engine.load(dir).step, 0); }), "(no error)");
    EXPECT_THAT(error_of([&] { engine.step({}); }), HasSubstr("after 0 of the step's 1 forward_backward call(s)"));
    engine.forward_backward(tokens.batch());
    engine.step({.lr = 1e-2f});

    Engine fresh(model(), world(), plan, options());  // the same seed: the saved state
    fresh.forward_backward(tokens.batch());
    fresh.step({.lr = 1e-2f});
    EXPECT_EQ(eval_loss(engine, tokens), eval_loss(fresh, tokens)) << "no trace of the dropped step";
  }
}

// Hands every call on to the engine's context, and throws at the n-th call of one kind: of gather
// (a unit held from then on, a prefetch in flight), or just after grads_ready (its reduction in flight).
class FailingContext final : public ParamContext {
 public:
  enum class At { gather, grads_ready };
  FailingContext(ParamContext& inner, At at, int n) : inner_(inner), at_(at), left_(n) {}
  const UnitTensors& gather(int unit) override {
    if (at_ == At::gather) count_down();
    return inner_.gather(unit);
  }
  void release(int unit) override { inner_.release(unit); }
  const UnitTensors& grads(int unit) override { return inner_.grads(unit); }
  void grads_ready(int unit) override {
    inner_.grads_ready(unit);
    if (at_ == At::grads_ready) count_down();
  }
  Device device() const override { return inner_.device(); }
  DType compute_dtype() const override { return inner_.compute_dtype(); }
  double* loss_sum() override { return inner_.loss_sum(); }

 private:
  void count_down() {
    if (--left_ == 0) throw Error("the model failed");
  }
  ParamContext& inner_;
  At at_;
  int left_;
};

// The tiny GPT-2, whose next forward_backward or forward fails where `fail_next` says, or once it is done
// (its loss added), on every rank alike.
class FailsPartway final : public Model {
 public:
  std::optional<std::pair<FailingContext::At, int>> fail_next;
  bool fail_when_done = false;
  std::vector<UnitSpec> units() const override { return model().units(); }
  void init_unit(int unit, const UnitTensors& params, uint64_t seed) const override {
    model().init_unit(unit, params, seed);
  }
  double forward_backward(ParamContext& ctx, const Batch& batch, float loss_scale) override {
    return run(ctx, [&](ParamContext& c) { return model().forward_backward(c, batch, loss_scale); });
  }
  double forward(ParamContext& ctx, const Batch& batch) override {
    return run(ctx, [&](ParamContext& c) { return model().forward(c, batch); });
  }
  int64_t activation_bytes(int B, int T, DType dtype) const override { return model().activation_bytes(B, T, dtype); }
  bool keeps_gradients_open(int B, int T) const override { return model().keeps_gradients_open(B, T); }
  int vocab_size() const override { return model().vocab_size(); }
  int context_length() const override { return model().context_length(); }

 private:
  template <class Fn>
  double run(ParamContext& ctx, Fn&& fn) {
    if (std::exchange(fail_when_done, false)) {
      fn(ctx);
      throw Error("the model failed");
    }
    if (!fail_next) return fn(ctx);
    FailingContext failing(ctx, fail_next->first, fail_next->second);
    fail_next.reset();
    return fn(failing);
  }
};

// A model that threw partway left units gathered, gradients requested and reductions in flight: every
// later micro-step failed on the protocol ("still gathered"), a load did not mend it. The step is dropped
// with the error, and training goes on as if it had never started, under every strategy.
TEST(EngineMisuse, AModelThatThrowsPartwayDropsTheStepAndTrainingGoesOn) {
  const Tokens tokens;
  for (StrategyKind kind : {StrategyKind::ddp, StrategyKind::zero2, StrategyKind::zero3}) {
    for (const auto& [at, n] : {std::pair{FailingContext::At::gather, 3}, std::pair{FailingContext::At::grads_ready, 2}}) {
      SCOPED_TRACE(detail::concat(strategy_name(kind), at == FailingContext::At::gather ? ", at gather " : ", after grads_ready ", n));
      FailsPartway failing;
      Engine engine(failing, world(), test::plan({kind}), {.seed = 3, .grad_accum = 2, .tokens_per_step = 2 * int64_t(kB) * kT * world().size()});
      // The first step fails in its second micro-step, the first evaluation partway.
      engine.forward_backward(tokens.batch());
      failing.fail_next = {at, n};
      EXPECT_EQ(error_of([&] { engine.forward_backward(tokens.batch()); }), "the model failed");
      EXPECT_THAT(error_of([&] { engine.step({}); }), HasSubstr("after 0 of the step's 2 forward_backward call(s)"));
      failing.fail_next = {FailingContext::At::gather, 2};
      EXPECT_EQ(error_of([&] { engine.forward(tokens.batch()); }), "the model failed");
      failing.fail_when_done = true;  // its loss is in the sum: no later forward's
      EXPECT_EQ(error_of([&] { engine.forward(tokens.batch()); }), "the model failed");
      for (int k = 0; k < 2; ++k) engine.forward_backward(tokens.batch());
      const StepStats stats = engine.step({.lr = 1e-2f});

      FailsPartway plain;
      Engine fresh(plain, world(), test::plan({kind}), {.seed = 3, .grad_accum = 2, .tokens_per_step = 2 * int64_t(kB) * kT * world().size()});
      for (int k = 0; k < 2; ++k) fresh.forward_backward(tokens.batch());
      const StepStats fresh_stats = fresh.step({.lr = 1e-2f});
      EXPECT_EQ(stats.loss, fresh_stats.loss);
      EXPECT_EQ(stats.grad_norm, fresh_stats.grad_norm) << "no trace of the dropped micro-steps";
      EXPECT_EQ(engine.forward(tokens.batch()), fresh.forward(tokens.batch()));
    }
  }
}

// A save into a committed checkpoint's directory uncommitted it before writing: a job killed then lost
// both.
TEST(EngineMisuse, ASaveOverACommittedCheckpointIsRefusedAndLeavesItWhole) {
  test::TempDir tmp;
  const std::string dir = test::shared_dir(tmp) + "/ck";
  const Tokens tokens;
  Engine engine(model(), world(), zero3(), options());
  engine.save(dir);
  const double saved = eval_loss(engine, tokens);
  engine.forward_backward(tokens.batch());
  engine.step({.lr = 1e-2f});
  const std::string refused = error_of([&] { engine.save(dir); });  // rank 0 looks, and tells the others
  EXPECT_THAT(refused, HasSubstr(world().rank() == 0
                                     ? dir + " holds a committed checkpoint: save into a new directory, or remove it first"
                                     : std::string("another rank failed")));
  EXPECT_EQ(engine.load(dir).step, 0) << "the checkpoint is whole";
  EXPECT_EQ(eval_loss(engine, tokens), saved);
}

}  // namespace
}  // namespace zshard
