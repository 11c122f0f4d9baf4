// Self-test of tests/testing/status_matchers.h: each matcher accepts what it should,
// rejects what it should, and explains a mismatch with the actual status.
#include "tests/testing/status_matchers.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace spgate::testing {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::Eq;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::SizeIs;
using ::testing::StartsWith;

template <typename T, typename M>
std::string Explain(const M& matcher, const T& value) {
  ::testing::StringMatchResultListener listener;
  ::testing::Matcher<const T&>(matcher).MatchAndExplain(value, &listener);
  return listener.str();
}

TEST(StatusMatchersTest, StatusIsOnStatus) {
  const absl::Status s = absl::InvalidArgumentError("window_steps must be in [1, 1000000]");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("window_steps")));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, StartsWith("window")));
  EXPECT_THAT(s, StatusIs(AnyOf(absl::StatusCode::kInvalidArgument,
                                absl::StatusCode::kOutOfRange)));
  EXPECT_THAT(s, Not(StatusIs(absl::StatusCode::kNotFound)));
  EXPECT_THAT(s, Not(StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("probe"))));
  EXPECT_THAT(absl::OkStatus(), StatusIs(absl::StatusCode::kOk));
  EXPECT_THAT(absl::NotFoundError("job j"),
              StatusIs(absl::StatusCode::kNotFound, "job j"));  // plain string: equality
}

TEST(StatusMatchersTest, StatusIsOnStatusOr) {
  const absl::StatusOr<int> err = absl::AbortedError("version 3, expected 2");
  EXPECT_THAT(err, StatusIs(absl::StatusCode::kAborted, HasSubstr("expected 2")));
  EXPECT_THAT(err, Not(StatusIs(absl::StatusCode::kOk)));
  const absl::StatusOr<int> ok = 5;
  EXPECT_THAT(ok, StatusIs(absl::StatusCode::kOk));
}

TEST(StatusMatchersTest, IsOk) {
  EXPECT_THAT(absl::OkStatus(), IsOk());
  EXPECT_THAT(absl::StatusOr<std::string>("x"), IsOk());
  EXPECT_THAT(absl::InternalError("boom"), Not(IsOk()));
  EXPECT_THAT(absl::StatusOr<int>(absl::InternalError("boom")), Not(IsOk()));
  EXPECT_OK(absl::OkStatus());
  ASSERT_OK(absl::StatusOr<int>(1));
}

TEST(StatusMatchersTest, IsOkAndHolds) {
  const absl::StatusOr<int> five = 5;
  EXPECT_THAT(five, IsOkAndHolds(5));
  EXPECT_THAT(five, IsOkAndHolds(Eq(5)));
  EXPECT_THAT(five, Not(IsOkAndHolds(6)));
  EXPECT_THAT(absl::StatusOr<int>(absl::InternalError("boom")), Not(IsOkAndHolds(5)));
  const absl::StatusOr<std::vector<int>> v = std::vector<int>{1, 2, 3};
  EXPECT_THAT(v, IsOkAndHolds(SizeIs(3)));
  EXPECT_THAT(absl::StatusOr<std::string>("spgate"), IsOkAndHolds(HasSubstr("gate")));
}

TEST(StatusMatchersTest, MismatchesAreExplained) {
  const absl::Status s = absl::InvalidArgumentError("memory_headroom must be in (0, 1]");
  EXPECT_THAT(Explain(StatusIs(absl::StatusCode::kNotFound), s),
              AllOf(HasSubstr("INVALID_ARGUMENT"), HasSubstr("memory_headroom"),
                    HasSubstr("code mismatch")));
  EXPECT_THAT(Explain(StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("window")), s),
              HasSubstr("message mismatch"));
  EXPECT_THAT(Explain(IsOkAndHolds(1), absl::StatusOr<int>(absl::UnavailableError("down"))),
              HasSubstr("UNAVAILABLE: down"));
  EXPECT_THAT(Explain(IsOk(), s), HasSubstr("INVALID_ARGUMENT"));
}

TEST(StatusMatchersTest, DescribesItself) {
  const ::testing::Matcher<absl::Status> m =
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("field"));
  EXPECT_THAT(::testing::DescribeMatcher<absl::Status>(m),
              AllOf(HasSubstr("status code"), HasSubstr("field")));
  const ::testing::Matcher<absl::StatusOr<int>> h = IsOkAndHolds(3);
  EXPECT_THAT(::testing::DescribeMatcher<absl::StatusOr<int>>(h), HasSubstr("is OK"));
}

}  // namespace
}  // namespace spgate::testing
