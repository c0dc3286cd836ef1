// Set-up validation of the trainer: every bad option is refused before the first collective, with a
// message naming the flag. Multi-rank exits for the same errors are covered by tests/cli.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <limits>

#include <zshard/lr_schedule.h>

#include "comm/agreed_failure.h"
#include "comm/self_communicator.h"
#include "runtime/cli/flags.h"
#include "runtime/cli/train_options.h"
#include "runtime/train/trainer.h"
#include "shard/device_setup.h"
#include "shard/step_graph.h"
#include "tests/support/test_support.h"

namespace zshard {
namespace {

using ::testing::HasSubstr;
using test::error_of;

// A world that claims `size` ranks; set-up only all-reduces, and with one real process the sum is
// the local value.
class PretendWorld : public comm::SelfCommunicator {
 public:
  explicit PretendWorld(int size) : size_(size) {}
  int size() const override { return size_; }
  // Every pretended rank gives what this one gives (the same model, say).
  comm::WorkPtr all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    const size_t bytes = count * dtype_size(dtype);
    for (int r = 0; r < size_; ++r) std::memcpy(static_cast<char*>(recv) + size_t(r) * bytes, send, bytes);
    return SelfCommunicator::all_gather(send, recv, count, dtype);
  }

 private:
  int size_;
};

std::string setup_error(const TrainOptions& o, int world_size) {
  PretendWorld world(world_size);
  try {
    Trainer trainer(o, world);
  } catch (const AgreedFailure& e) {
    EXPECT_TRUE(e.report());
    return std::to_string(e.exit_code()) + ": " + e.what();
  }
  return "no error";
}

TEST(TrainOptions, ModelSmallerThanWorldIsRefused) {
  TrainOptions o;
  o.model.overrides = {{"layers", 1}, {"dim", 1}, {"heads", 1}, {"vocab", 1}, {"ctx", 1}};
  o.data.seq = 1;
  o.data.batch = 64;
  EXPECT_THAT(setup_error(o, 64), HasSubstr("2: the model has"));
  EXPECT_THAT(setup_error(o, 64), HasSubstr("fewer than the 64 ranks"));
}

TEST(TrainOptions, BadValuesNameTheirFlag) {
  auto with = [](auto edit) {
    TrainOptions o;
    edit(o);
    return setup_error(o, 4);
  };
  EXPECT_THAT(with([](TrainOptions& o) { o.data.grad_accum = 0; }), HasSubstr("2: --grad-accum must be >= 1"));
  EXPECT_THAT(with([](TrainOptions& o) { o.data.grad_accum = (1 << 20) + 1; }),
              HasSubstr("2: --grad-accum must be at most 1048576, got 1048577"));
  EXPECT_THAT(with([](TrainOptions& o) { o.optimizer.beta2 = 1.0f; }), HasSubstr("2: --beta2 must be in [0, 1)"));
  EXPECT_THAT(with([](TrainOptions& o) { o.optimizer.lr_schedule = "linear"; }), HasSubstr("2: --lr-schedule"));
  EXPECT_THAT(with([](TrainOptions& o) { o.optimizer.grad_clip = -1; }), HasSubstr("2: --grad-clip"));
  EXPECT_THAT(with([](TrainOptions& o) { o.plan.strategy.shard_group = ShardGroupRequest::equal(2); }),
              HasSubstr("2: --shard-group is only for --strategy hybrid"));
  EXPECT_THAT(with([](TrainOptions& o) { o.plan.strategy.kind = StrategyKind::hybrid, o.plan.strategy.shard_group = ShardGroupRequest::list({2, 1}); }),
              HasSubstr("2: --shard-group 2,1: the groups hold 3 ranks, the world has 4"));
  EXPECT_THAT(with([](TrainOptions& o) { o.plan.strategy.kind = StrategyKind::hybrid, o.plan.strategy.shard_group = ShardGroupRequest::equal(3); }),
              HasSubstr("2: --shard-group 3 does not divide the world size 4"));
  EXPECT_THAT(with([](TrainOptions& o) { o.plan.strategy.shard_group = ShardGroupRequest::list({2, 2}); }),
              HasSubstr("2: --shard-group is only for --strategy hybrid"));
  EXPECT_THAT(with([](TrainOptions& o) { o.data.rank_batches = {2, 2, 2, 0}; }),
              HasSubstr("every rank needs at least one sequence"));
  EXPECT_THAT(with([](TrainOptions& o) { o.data.rank_batches_auto = true, o.data.rank_batches = {2}; }),
              HasSubstr("2: --rank-batches auto takes no sizes beside it, got auto and 2"));
  EXPECT_THAT(with([](TrainOptions& o) { o.data.rank_batches_auto = true, o.data.batch = 3; }),
              HasSubstr("2: --batch 3 is smaller than the world size 4"));
  EXPECT_THAT(with([](TrainOptions& o) { o.data.rank_batches_auto = true, o.data.rebalance_every = -1; }),
              HasSubstr("2: --rebalance-every must be >= 0"));
  EXPECT_THAT(with([](TrainOptions& o) { o.eval.every = -1; }), HasSubstr("2: --eval-every must be >= 0"));
  EXPECT_THAT(with([](TrainOptions& o) { o.eval.every = 5, o.eval.batches = 0; }),
              HasSubstr("2: --eval-batches must be >= 1, got 0"));
  EXPECT_THAT(with([](TrainOptions& o) { o.eval.every = 5; }), HasSubstr("2: --eval-every needs --eval-data"));
  EXPECT_THAT(with([](TrainOptions& o) { o.eval.source = "default"; }),
              HasSubstr("2: --eval-data is only for --eval-every N"));
  EXPECT_THAT(with([](TrainOptions& o) { o.eval.batches = 8; }), HasSubstr("2: --eval-batches is only for --eval-every N"));
  EXPECT_THAT(with([](TrainOptions& o) { o.eval.every = 5, o.eval.source = "/no/such/eval.bin"; }),
              HasSubstr("/no/such/eval.bin"));
  EXPECT_THAT(with([](TrainOptions& o) { o.data.rebalance_every = 2; }),
              HasSubstr("2: --rebalance-every is only for --rank-batches auto"));
  EXPECT_THAT(with([](TrainOptions& o) { o.data.rank_batches_auto = true, o.data.max_rank_batch = 0; }),
              HasSubstr("2: --max-rank-batch must be >= 1, got 0"));
  EXPECT_THAT(with([](TrainOptions& o) { o.data.rank_batches_auto = true, o.data.max_rank_batch = 1; }),
              HasSubstr("2: --max-rank-batch 1 on 4 ranks holds fewer than --batch 8 sequences"));
  EXPECT_THAT(with([](TrainOptions& o) { o.data.max_rank_batch = 4; }),
              HasSubstr("2: --max-rank-batch is only for --rank-batches auto"));
  EXPECT_THAT(with([](TrainOptions& o) { o.model.overrides["heads"] = 5; }),
              HasSubstr("2: model 'tiny' (ctx=128, dim=64, heads=5, layers=2, vocab=256): GPT-2 config: dim 64 is not "
                        "divisible by heads 5"));
  EXPECT_THAT(with([](TrainOptions& o) { o.model.overrides["experts"] = 8; }),
              HasSubstr("2: --config: model 'tiny' has no 'experts'"));
  // Beside a key it has, the listing still shows the model's own values (ctx=128), not the override.
  EXPECT_THAT(with([](TrainOptions& o) { o.model.overrides = {{"ctx", 64}, {"kv_heads", 2}}; }),
              HasSubstr("2: --config: model 'tiny' has no 'kv_heads' (it has, by default: ctx=128, dim=64, heads=4, "
                        "layers=2, "));
  EXPECT_THAT(with([](TrainOptions& o) { o.model.overrides = {{"lora_rank", 4}, {"lora_targets", "c_atn"}}; }),
              HasSubstr("2: --lora-targets: GPT-2 has no layer 'c_atn' (valid: c_attn, c_proj, c_fc,"));
  EXPECT_THAT(with([](TrainOptions& o) { o.model.name = "gpt5"; }), HasSubstr("2: --model: unknown model 'gpt5' (known: "));
  EXPECT_THAT(with([](TrainOptions& o) { o.data.source = "/no/such/data.bin"; }),
              HasSubstr("2: --data /no/such/data.bin: no such file"));
  EXPECT_THAT(with([](TrainOptions& o) { o.output.log_json = "/no/such/dir/log.json"; }), HasSubstr("2: --log-json"));
  EXPECT_THAT(with([](TrainOptions& o) { o.output.mem_report = "/"; }), HasSubstr("2: --mem-report /: is a directory"));
  EXPECT_THAT(with([](TrainOptions& o) { o.output.save = "log.json", o.output.log_json = "./log.json"; }),
              HasSubstr("2: --save log.json names the same file as --log-json"));
}

// Shard groups are runs of consecutive ranks of any sizes; units pad to a multiple of every size.
TEST(ShardGroups, RanksSizesAndPadding) {
  const ShardGroups g({4, 2});
  EXPECT_EQ(g.count(), 2);
  EXPECT_EQ(g.world_size(), 6);
  EXPECT_EQ(g.group_of(3), 0);
  EXPECT_EQ(g.group_of(4), 1);
  EXPECT_EQ(g.first_rank(1), 4);
  EXPECT_EQ(g.size_of_rank(5), 2);
  EXPECT_FALSE(g.equal());
  EXPECT_EQ(g.describe(), "4,2");
  EXPECT_EQ(g.pad_multiple(), 4);
  EXPECT_EQ(ShardGroups({4, 3, 2}).pad_multiple(), 12);
  EXPECT_EQ(ShardGroups({3, 3}).describe(), "3");
  StrategyOptions hybrid{StrategyKind::hybrid, ShardGroupRequest::list({3, 3}), true, 2};
  EXPECT_EQ(shard_group_size(hybrid, 6), 3);  // a list of equal sizes is the plain group size
  hybrid.shard_group = ShardGroupRequest::list({4, 2});
  EXPECT_THROW(shard_group_size(hybrid, 6), UsageError);
  EXPECT_EQ(shard_groups(hybrid, 6).sizes(), (std::vector<int>{4, 2}));
  EXPECT_EQ(shard_groups({StrategyKind::ddp}, 3).sizes(), (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(shard_groups({StrategyKind::zero2}, 3).sizes(), (std::vector<int>{3}));
  // A library caller's empty list is refused, not read past its end.
  hybrid.shard_group = ShardGroupRequest::list({});
  EXPECT_THAT(error_of([&] { shard_groups(hybrid, 6); }), HasSubstr("an empty list of group sizes"));
  EXPECT_THROW(shard_groups(hybrid, 6), UsageError);
}

// The least common multiple of a list of group sizes was an int: 2,3,5,...,31 overflowed it, and every
// rank padded its units to a negative size. A list whose multiple passes the bound, or whose sizes sum
// past an int, is refused naming the flag.
TEST(ShardGroups, CommonMultipleAndWorldAreBounded) {
  StrategyOptions hybrid{StrategyKind::hybrid, ShardGroupRequest::list({2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31})};
  EXPECT_THAT(error_of([&] { shard_groups(hybrid, 160); }),
              HasSubstr("--shard-group 2,3,5,7,11,13,17,19,23,29,31: every unit is padded to a multiple of each "
                        "group's size, and the least common multiple of these exceeds 1048576"));
  EXPECT_THROW(shard_groups(hybrid, 160), UsageError);
  EXPECT_THROW(ShardGroups({2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31}), Error);
  hybrid.shard_group = ShardGroupRequest::list({INT_MAX, 2});
  EXPECT_THAT(error_of([&] { shard_groups(hybrid, 6); }), HasSubstr("2147483649 ranks in all"));
  // Within the bound: 2^20 is the multiple of 2^20 and 2.
  EXPECT_EQ(ShardGroups({1 << 20, 2}).pad_multiple(), 1 << 20);
  EXPECT_EQ(ShardGroups({16, 9, 5, 7}).pad_multiple(), 5040);
}

// `!(x >= 0)` lets +inf through: every float flag is checked for finiteness and range.
TEST(TrainOptions, FloatFlagsMustBeFiniteAndInRange) {
  auto with = [](auto edit) {
    TrainOptions o;
    edit(o);
    return setup_error(o, 2);
  };
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(with([&](TrainOptions& o) { o.optimizer.lr = inf; }), HasSubstr("2: --lr must be a finite number in [0, 1], got inf"));
  EXPECT_THAT(with([&](TrainOptions& o) { o.optimizer.lr = nan; }), HasSubstr("2: --lr must be a finite number"));
  EXPECT_THAT(with([&](TrainOptions& o) { o.optimizer.lr = 1e30f; }), HasSubstr("2: --lr must be a finite number in [0, 1]"));
  EXPECT_THAT(with([&](TrainOptions& o) { o.optimizer.min_lr = 0.01f; }), HasSubstr("2: --min-lr must be a finite number in [0, 0.003] (at most --lr)"));
  EXPECT_THAT(with([&](TrainOptions& o) { o.optimizer.wd = inf; }), HasSubstr("2: --wd must be a finite number >= 0"));
  EXPECT_THAT(with([&](TrainOptions& o) { o.optimizer.wd = 1000; }), HasSubstr("2: --wd 1000 times --lr 0.003 exceeds 1"));
  EXPECT_THAT(with([&](TrainOptions& o) { o.optimizer.eps = inf; }), HasSubstr("2: --eps must be in (0, 1]"));
  EXPECT_THAT(with([&](TrainOptions& o) { o.optimizer.eps = 0; }), HasSubstr("2: --eps must be in (0, 1]"));
  EXPECT_THAT(with([&](TrainOptions& o) { o.optimizer.beta1 = nan; }), HasSubstr("2: --beta1 must be in [0, 1)"));
  EXPECT_THAT(with([&](TrainOptions& o) { o.optimizer.grad_clip = inf; }), HasSubstr("2: --grad-clip must be a finite number >= 0"));
  EXPECT_THAT(with([&](TrainOptions& o) { o.plan.comm_timeout_s = double(inf); }), HasSubstr("2: --comm-timeout must be a finite number"));
  EXPECT_THAT(with([&](TrainOptions& o) { o.plan.comm_timeout_s = 0; }), HasSubstr("2: --comm-timeout must be a finite number"));
  EXPECT_EQ(with([&](TrainOptions& o) { o.optimizer.steps = 0, o.optimizer.lr = 1, o.optimizer.min_lr = 1, o.optimizer.wd = 1; }), "no error");
}

// Mixed precision runs on the cpu as on a GPU, and reduces in bf16 over mpi as over nccl; nccl needs a GPU.
TEST(TrainOptions, DtypeAndCommNeedTheirDeviceAndBackend) {
  TrainOptions o;
  o.plan.placement.param_dtype = DType::bf16;
  EXPECT_EQ(setup_error(o, 2), "no error");
  o.plan.placement.reduce_dtype = DType::bf16;
  o.plan.comm = CommBackend::mpi;
  EXPECT_EQ(setup_error(o, 2), "no error");
  o = TrainOptions{};
  o.plan.comm = CommBackend::nccl;
  EXPECT_THAT(setup_error(o, 2), HasSubstr("2: --comm nccl needs --device cuda"));
  o = TrainOptions{};
  o.plan.placement.param_dtype = DType::f64;
  EXPECT_THAT(setup_error(o, 2), HasSubstr("2: --param-dtype must be fp32 or bf16, got f64"));
}

// Without the CUDA path, or on a machine without a GPU (CI), --device cuda fails at set-up, naming the
// flag and the reason, before anything touches the device.
TEST(TrainOptions, CudaWithoutUsableGpuIsRefused) {
  const std::string why = device_unavailable(Device::cuda);
  if (why.empty()) GTEST_SKIP() << "a GPU is usable here";
  TrainOptions o;
  o.plan.placement.device = Device::cuda;
  EXPECT_THAT(setup_error(o, 2), HasSubstr("2: --device cuda: " + why));
}

TEST(TrainOptions, RankBatchesParseSizesOrAuto) {
  TrainOptions o;
  CLI::App app;
  add_train_flags(app, o);
  app.parse("--rank-batches 3,1,2,2");
  EXPECT_EQ(o.data.rank_batches, (std::vector<int>{3, 1, 2, 2}));
  EXPECT_FALSE(o.data.rank_batches_auto);
  app.parse("--rank-batches auto --rebalance-every 3 --max-rank-batch 6");
  EXPECT_TRUE(o.data.rank_batches.empty());
  EXPECT_TRUE(o.data.rank_batches_auto);
  EXPECT_EQ(o.data.rebalance_every, 3);
  EXPECT_EQ(o.data.max_rank_batch, 6);
  try {
    app.parse("--rank-batches 3,fast");
    ADD_FAILURE() << "'fast' accepted";
  } catch (const CLI::Error& e) {
    EXPECT_THAT(cli_error_line(e, app), HasSubstr("--rank-batches: expected integers or 'auto', got 'fast'"));
  }
}

// CLI11's delimiter dropped empty items ("2,1," read as 2,1): every list flag refuses them instead.
TEST(TrainOptions, EmptyItemsOfCommaListsAreRefused) {
  TrainOptions o;
  CLI::App app;
  add_train_flags(app, o);
  app.parse("--shard-group 2,1 --rank-batches 3,3,2");
  EXPECT_EQ(o.plan.strategy.shard_group, ShardGroupRequest::list({2, 1}));
  EXPECT_EQ(o.data.rank_batches, (std::vector<int>{3, 3, 2}));
  for (const char* bad : {"--shard-group 2,1,", "--shard-group 2,,1", "--rank-batches 3,3,2,", "--rank-batches ,3",
                          "--config layers=2,,dim=32"}) {
    try {
      app.parse(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const CLI::Error& e) {
      const std::string flag = std::string(bad).substr(0, std::string(bad).find(' '));
      EXPECT_THAT(cli_error_line(e, app), HasSubstr(flag + ": empty item in the list '")) << bad;
    }
  }
}

// A model key set twice is refused whatever the order: CLI11 runs --config's callback before --layers'.
TEST(TrainOptions, AModelKeySetTwiceIsRefused) {
  TrainOptions o;
  CLI::App app;
  add_train_flags(app, o);
  for (const char* twice : {"--layers 2 --config layers=3", "--config layers=3 --layers 2", "--config layers=3,layers=4",
                            "--config layers=3 --config layers=4", "--tie-embeddings 1 --config tie_embeddings=0"}) {
    try {
      app.parse(twice);
      ADD_FAILURE() << twice << " accepted";
    } catch (const CLI::Error& e) {
      EXPECT_THAT(cli_error_line(e, app), HasSubstr("is set twice (also by --")) << twice;
    }
  }
  app.parse("--config layers=3,dim=32 --heads 2");  // each parse starts afresh
  EXPECT_EQ(o.model.overrides.at("layers"), ConfigValue(int64_t(3)));
  EXPECT_EQ(o.model.overrides.at("heads"), ConfigValue(int64_t(2)));
}

// The LoRA flags are shorthands of --config, in every tool that takes a model; --config continues a text
// value over the list's commas. An alpha or targets without a rank is refused naming its flag.
TEST(TrainOptions, LoraFlagsSetTheModelConfig) {
  TrainOptions o;
  CLI::App app;
  add_train_flags(app, o);
  app.parse("--lora-rank 4 --lora-alpha 16 --lora-targets c_attn,c_fc");
  EXPECT_EQ(o.model.overrides.at("lora_rank"), ConfigValue(int64_t(4)));
  EXPECT_EQ(o.model.overrides.at("lora_alpha"), ConfigValue(16.0));
  EXPECT_EQ(o.model.overrides.at("lora_targets"), ConfigValue("c_attn,c_fc"));
  o.model.overrides.clear();
  app.parse("--config lora_rank=2,lora_targets=c_attn,c_fc,layers=3");
  EXPECT_EQ(o.model.overrides.at("lora_targets"), ConfigValue("c_attn,c_fc"));
  EXPECT_EQ(o.model.overrides.at("layers"), ConfigValue(int64_t(3)));
  for (const auto& [flags, message] :
       {std::pair{"--lora-alpha 16", "--lora-alpha: lora_alpha needs --lora-rank"},
        std::pair{"--lora-targets c_fc", "--lora-targets: lora_targets needs --lora-rank"},
        std::pair{"--config lora_alpha=16", "--config: lora_alpha needs --lora-rank"},
        std::pair{"--lora-rank 2 --lora-targets q_proj,v_proj,q_proj", "--lora-targets: 'q_proj' is listed twice"}}) {
    try {
      app.parse(flags);
      ADD_FAILURE() << flags << " accepted";
    } catch (const CLI::Error& e) {
      EXPECT_THAT(cli_error_line(e, app), HasSubstr(message)) << flags;
      EXPECT_NE(e.get_exit_code(), 0) << flags;  // the tools exit 2
    }
  }
}

TEST(TrainOptions, DeviceFlagsParseByName) {
  TrainOptions o;
  CLI::App app;
  add_train_flags(app, o);
  EXPECT_EQ(comm_backend(o.plan), CommBackend::mpi);
  app.parse("--device cuda --param-dtype bf16 --reduce-dtype fp32");
  EXPECT_EQ(o.plan.placement.device, Device::cuda);
  EXPECT_EQ(o.plan.placement.param_dtype, DType::bf16);
  EXPECT_EQ(o.plan.placement.reduce_dtype, DType::f32);
  EXPECT_EQ(comm_backend(o.plan), CommBackend::nccl);  // the default on cuda
  app.parse("--device cuda --comm mpi");
  EXPECT_EQ(comm_backend(o.plan), CommBackend::mpi);
  try {
    app.parse("--param-dtype fp16");
    ADD_FAILURE() << "fp16 accepted";
  } catch (const CLI::Error& e) {
    EXPECT_THAT(cli_error_line(e, app), HasSubstr("--param-dtype"));
  }
}

TEST(TrainOptions, FusedEpiloguesParseByName) {
  TrainOptions o;
  CLI::App app;
  add_train_flags(app, o);
  EXPECT_EQ(o.model.fused_epilogues, FusedEpilogues::automatic);
  for (const auto& [name, mode] : {std::pair{"on", FusedEpilogues::on}, std::pair{"off", FusedEpilogues::off},
                                   std::pair{"auto", FusedEpilogues::automatic}}) {
    app.parse(std::string("--fused-epilogues ") + name);
    EXPECT_EQ(o.model.fused_epilogues, mode) << name;
    EXPECT_EQ(fused_epilogues_flag(mode), name);
  }
  try {
    app.parse("--fused-epilogues yes");
    ADD_FAILURE() << "yes accepted";
  } catch (const CLI::Error& e) {
    EXPECT_THAT(cli_error_line(e, app), HasSubstr("--fused-epilogues"));
  }
}

// A step is one graph only where nothing but the device runs inside it: cuda, one rank, no host AdamW.
TEST(TrainOptions, CudaGraphsNeedOneRankOnCudaWithoutOffload) {
  TrainOptions o;
  o.model.cuda_graphs = true;
  EXPECT_THAT(setup_error(o, 1), HasSubstr("2: --cuda-graphs on: CUDA graphs record GPU work; this run is on the cpu"));
  Placement placement{.device = Device::cuda};
  EXPECT_NO_THROW(check_cuda_graphs(placement, 1));
  EXPECT_THAT(error_of([&] { check_cuda_graphs(placement, 2); }),
              HasSubstr("on one rank only; this run has 2"));
  placement.offload_optimizer = true;
  EXPECT_THAT(error_of([&] { check_cuda_graphs(placement, 1); }),
              HasSubstr("--cuda-graphs on: the offloaded optimizer steps on the host, inside the step (--offload)"));
}

TEST(TrainOptions, BatchIsANumberOrAuto) {
  TrainOptions o;
  CLI::App app;
  add_train_flags(app, o);
  app.parse("--batch 12");
  EXPECT_EQ(o.data.batch, 12);
  EXPECT_FALSE(o.data.auto_batch);
  app.parse("--batch auto --mem-budget 2GiB");
  EXPECT_TRUE(o.data.auto_batch);
  EXPECT_EQ(o.data.mem_budget, "2GiB");
  for (const char* bad : {"--batch x", "--batch 8x", "--batch 1.5"}) {
    try {
      app.parse(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const CLI::Error& e) {
      EXPECT_THAT(cli_error_line(e, app), HasSubstr("--batch")) << bad;
    }
  }
}

// A shorthand of --config for a key the model lacks is named as the user gave it.
TEST(TrainOptions, AShorthandTheModelLacksIsNamedByItself) {
  for (const auto& [flags, message] :
       {std::pair{"--model tiny --kv-heads 2", "--kv-heads: model 'tiny' has no 'kv_heads' (it has, by default: "},
        std::pair{"--model gpt2 --tie-embeddings false", "--tie-embeddings: model 'gpt2' has no 'tie_embeddings'"},
        std::pair{"--model tiny --config kv_heads=2", "--config: model 'tiny' has no 'kv_heads'"}}) {
    TrainOptions o;
    CLI::App app;
    add_train_flags(app, o);
    try {
      app.parse(flags);
      EXPECT_THAT(test::error_of([&] { model_config(o.model.name, o.model.overrides); }), HasSubstr(message)) << flags;
    } catch (const CLI::Error& e) {
      EXPECT_THAT(cli_error_line(e, app), HasSubstr(message)) << flags;
    }
  }
}

TEST(TrainOptions, AValueItsTypeCannotHoldNamesTheFlagAndTheType) {
  TrainOptions o;
  CLI::App app;
  add_train_flags(app, o);
  for (const auto& [flags, message] :
       {std::pair{"--lr abc", "--lr: expected a number within range, got 'abc'"},
        std::pair{"--steps 99999999999", "--steps: expected an integer within range, got '99999999999'"},
        std::pair{"--seed 1.5", "--seed: expected "}}) {
    try {
      app.parse(flags);
      ADD_FAILURE() << flags << " accepted";
    } catch (const CLI::Error& e) {
      EXPECT_THAT(cli_error_line(e, app), HasSubstr(message)) << flags;
    }
  }
}

TEST(TrainOptions, MemBudgetBelongsToAutoBatch) {
  TrainOptions o;
  o.data.mem_budget = "1GB";
  EXPECT_THAT(setup_error(o, 2), HasSubstr("2: --mem-budget is the budget of --batch auto"));
  o.data.auto_batch = true;
  o.data.mem_budget = "1 parsec";
  EXPECT_THAT(setup_error(o, 2), HasSubstr("2: --mem-budget"));
  o.data.mem_budget = "1GB";
  o.data.rank_batches = {4, 4};
  EXPECT_THAT(setup_error(o, 2), HasSubstr("2: --batch auto and --rank-batches exclude each other"));
}

// Flags that would do nothing in the combination given are refused, naming the flag.
TEST(TrainOptions, FlagsWithoutEffectAreRefused) {
  TrainOptions o;
  o.optimizer.lr_schedule = "constant";
  o.optimizer.min_lr = 1e-4f;
  EXPECT_THAT(setup_error(o, 2), HasSubstr("2: --min-lr is only for --lr-schedule cosine"));
  o.optimizer.min_lr = 0;
  EXPECT_EQ(setup_error(o, 2), "no error");
  for (StrategyKind kind : {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2}) {
    o = TrainOptions{};
    o.plan.strategy.kind = kind;
    o.plan.strategy.max_inflight = 4;
    EXPECT_THAT(setup_error(o, 2), HasSubstr("2: --max-inflight is only for --strategy zero3 or hybrid"));
    o.plan.strategy.max_inflight = 2;
    o.plan.strategy.reshard_after_forward = false;
    EXPECT_THAT(setup_error(o, 2), HasSubstr("2: --reshard-after-forward is only for --strategy zero3 or hybrid"));
  }
  o.plan.strategy.kind = StrategyKind::zero3;
  o.plan.strategy.max_inflight = 4;
  EXPECT_EQ(setup_error(o, 2), "no error");
}

// --save-dir is a directory the run creates: an output file named as it would fail only after training, and
// checkpoints written inside the checkpoint resumed from would write into an input.
TEST(TrainOptions, SaveDirIsNoOtherOutputAndNoInput) {
  const test::TempDir dir("zshard-options");
  TrainOptions o;
  o.saves.save_dir = dir.file("ck");
  o.output.save = dir.file("ck");
  EXPECT_THAT(setup_error(o, 2), HasSubstr("2: --save " + o.output.save + " names the same file as --save-dir"));
  o.output.save = "";
  o.output.log_json = dir.file("./ck");
  EXPECT_THAT(setup_error(o, 2), HasSubstr("2: --log-json " + o.output.log_json + " names the same file as --save-dir"));
  o.output.log_json = "";
  o.saves.resume = dir.path().string();  // checked before it is read
  EXPECT_THAT(setup_error(o, 2), HasSubstr("2: --save-dir " + o.saves.save_dir + " lies inside " + o.saves.resume + " (--resume)"));
}

TEST(LrSchedule, WarmupThenCosineToMin) {
  const LrSchedule s{1.0f, 0.1f, 4, 14, true};
  EXPECT_FLOAT_EQ(s.at(0), 0.25f);
  EXPECT_FLOAT_EQ(s.at(3), 1.0f);
  EXPECT_FLOAT_EQ(s.at(4), 1.0f);
  EXPECT_NEAR(s.at(9), 0.55f, 1e-6);  // halfway through the decay
  EXPECT_NEAR(s.at(14), 0.1f, 1e-6);
  EXPECT_NEAR(s.at(100), 0.1f, 1e-6);  // stays at the floor past the end
  const LrSchedule constant{0.5f, 0.0f, 0, 10, false};
  EXPECT_FLOAT_EQ(constant.at(7), 0.5f);
  EXPECT_THROW(s.at(-3), UsageError);  // warmup's ramp gave it a negative rate
  // A loop of one's own that leaves total_steps out gets a refusal, not a rate of 0 after warmup.
  EXPECT_THAT(test::error_of([] { LrSchedule{.lr = 3e-4f, .warmup = 10}.at(11); }),
              HasSubstr("cosine decay needs total_steps >= 1"));
  EXPECT_THAT(test::error_of([] { LrSchedule{.lr = -1, .min_lr = 5, .total_steps = 9}.at(0); }),
              HasSubstr("lr must be a finite number >= 0, got -1"));
  EXPECT_THAT(test::error_of([] { LrSchedule{.lr = 1, .min_lr = 5, .total_steps = 9}.at(0); }),
              HasSubstr("min_lr must be in [0, lr 1], got 5"));
}

}  // namespace
}  // namespace zshard
