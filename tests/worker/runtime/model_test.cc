// The model's shape (worker/runtime/model.h): impossible shapes are refused naming
// the flags.

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/runtime/test_util.h"
#include "worker/runtime/model.h"

namespace spgate::runtime {
namespace {

using ::spgate::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ValidationTest, ImpossibleShapesNameTheFlags) {
  ModelShape s{.layers = 2, .hidden = 96, .heads = 6, .ffn_hidden = 256};
  EXPECT_THAT(ValidateModelShape(s, 4), StatusIs(absl::StatusCode::kInvalidArgument,
                                                 ::testing::AllOf(HasSubstr("--heads=6"),
                                                                  HasSubstr("--tp=4"))));
  EXPECT_OK(ValidateModelShape(s, 2));
  s.ffn_hidden = 250;
  EXPECT_THAT(ValidateModelShape(s, 4),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--heads=6")));
  s.heads = 4;
  s.hidden = 64;
  EXPECT_THAT(ValidateModelShape(s, 4),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--ffn_hidden=250")));
  s.hidden = 66;
  EXPECT_THAT(ValidateModelShape(s, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--hidden=66")));
  s = {.layers = 0};
  EXPECT_THAT(ValidateModelShape(s, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--layers=0")));
}

}  // namespace
}  // namespace spgate::runtime
