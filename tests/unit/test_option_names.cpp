// The core library's errors name what its caller set: the API's option for a program of its own, the flag
// for zshard's tools. The same check words both.
#include <gtest/gtest.h>

#include <zshard/error.h>
#include <zshard/model_registry.h>
#include <zshard/plan.h>

#include "kernels/option_names.h"

namespace zshard {
namespace {

// Runs `body` under `naming`, then puts back the naming the test binaries use (flags).
template <class Body>
std::string message_under(OptionNaming naming, Body body) {
  set_option_naming(naming);
  std::string message;
  try {
    body();
  } catch (const UsageError& e) {
    message = e.what();
  }
  set_option_naming(OptionNaming::flags);
  return message;
}

TEST(OptionNames, PlanErrorsNameTheApiOptionOrTheFlag) {
  PlanOptions options;
  options.strategy.kind = StrategyKind::zero3;
  options.strategy.max_inflight = 0;
  const auto check = [&] { validate_plan_options(options); };
  EXPECT_EQ(message_under(OptionNaming::api, check), "StrategyOptions::max_inflight must be >= 1, got 0");
  EXPECT_EQ(message_under(OptionNaming::flags, check), "--max-inflight must be >= 1, got 0");

  options.strategy = {StrategyKind::ddp, ShardGroupRequest::equal(2)};
  EXPECT_EQ(message_under(OptionNaming::api, check),
            "StrategyOptions::shard_group is only for StrategyOptions::kind hybrid");
  EXPECT_EQ(message_under(OptionNaming::flags, check), "--shard-group is only for --strategy hybrid");
}

TEST(OptionNames, SettingsWithValuesAndModelErrors) {
  set_option_naming(OptionNaming::api);
  EXPECT_EQ(option_setting(Option::offload, "none", "false"), "Placement::offload_optimizer = false");
  set_option_naming(OptionNaming::flags);
  EXPECT_EQ(option_setting(Option::offload, "none", "false"), "--offload none");
  const auto unknown_model = [] { model_config("no-such-model"); };
  EXPECT_EQ(message_under(OptionNaming::api, unknown_model).rfind("the model name: unknown model", 0), 0u);
  EXPECT_EQ(message_under(OptionNaming::flags, unknown_model).rfind("--model: unknown model", 0), 0u);
}

}  // namespace
}  // namespace zshard
