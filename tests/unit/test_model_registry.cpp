// The model registry, as a user's binary fills it: a builder that returns no model is named at
// build_model, not dereferenced by whichever tool took it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <zshard/error.h>
#include <zshard/model_registry.h>

#include "tests/support/test_support.h"

namespace zshard {
namespace {

TEST(ModelRegistry, ABuilderThatReturnsNoModelIsNamed) {
  register_model("returns-nothing", {{"width", 4}}, [](const ModelConfig&) { return std::unique_ptr<Model>(); });
  EXPECT_THAT(test::error_of([] { build_model("returns-nothing", model_config("returns-nothing")); }),
              ::testing::HasSubstr("model 'returns-nothing': its registered builder returned no model"));
  EXPECT_THROW(build_model("returns-nothing", model_config("returns-nothing")), Error);
}

}  // namespace
}  // namespace zshard
