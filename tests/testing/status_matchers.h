// GoogleTest matchers for absl::Status and absl::StatusOr<T>, for every test folder
// (this Abseil predates absl/status/status_matchers.h). Each matcher works on both a
// Status and a StatusOr, and a failure prints the whole status, so a test says exactly
// which error it expects instead of "not ok".
//
// Usage:
//   #include "tests/testing/status_matchers.h"
//   using ::spgate::testing::IsOk;
//   using ::spgate::testing::IsOkAndHolds;
//   using ::spgate::testing::StatusIs;
//   EXPECT_THAT(ValidateGateConfig(c),
//               StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("window_steps")));
//   EXPECT_THAT(ComputeLengthStats(lengths), IsOkAndHolds(Field(&LengthStats::tokens, 10)));
//   EXPECT_OK(status_or);  ASSERT_OK(status);
#ifndef SPGATE_TESTS_TESTING_STATUS_MATCHERS_H_
#define SPGATE_TESTS_TESTING_STATUS_MATCHERS_H_

#include <ostream>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace spgate::testing {
namespace internal {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

// The code/message part shared by the Status and StatusOr instantiations.
class StatusIsCommon {
 public:
  StatusIsCommon(::testing::Matcher<absl::StatusCode> code,
                 ::testing::Matcher<const std::string&> message)
      : code_(std::move(code)), message_(std::move(message)) {}

  void DescribeTo(std::ostream* os) const {
    *os << "has a status code that ";
    code_.DescribeTo(os);
    *os << ", and has an error message that ";
    message_.DescribeTo(os);
  }
  void DescribeNegationTo(std::ostream* os) const {
    *os << "has a status code that ";
    code_.DescribeNegationTo(os);
    *os << ", or has an error message that ";
    message_.DescribeNegationTo(os);
  }

  bool MatchAndExplain(const absl::Status& status,
                       ::testing::MatchResultListener* listener) const {
    *listener << "whose status is " << status.ToString();
    ::testing::StringMatchResultListener inner;
    if (!code_.MatchAndExplain(status.code(), &inner)) {
      *listener << " (code mismatch" << (inner.str().empty() ? "" : ": " + inner.str()) << ")";
      return false;
    }
    const std::string message(status.message());
    if (!message_.MatchAndExplain(message, &inner)) {
      *listener << " (message mismatch" << (inner.str().empty() ? "" : ": " + inner.str())
                << ")";
      return false;
    }
    return true;
  }

 private:
  ::testing::Matcher<absl::StatusCode> code_;
  ::testing::Matcher<const std::string&> message_;
};

template <typename T>
class StatusIsImpl : public ::testing::MatcherInterface<T> {
 public:
  explicit StatusIsImpl(StatusIsCommon common) : common_(std::move(common)) {}
  void DescribeTo(std::ostream* os) const override { common_.DescribeTo(os); }
  void DescribeNegationTo(std::ostream* os) const override { common_.DescribeNegationTo(os); }
  bool MatchAndExplain(T actual, ::testing::MatchResultListener* listener) const override {
    return common_.MatchAndExplain(GetStatus(actual), listener);
  }

 private:
  StatusIsCommon common_;
};

class StatusIsMatcher {
 public:
  StatusIsMatcher(::testing::Matcher<absl::StatusCode> code,
                  ::testing::Matcher<const std::string&> message)
      : common_(std::move(code), std::move(message)) {}
  template <typename T>
  operator ::testing::Matcher<T>() const {  // NOLINT: implicit by design
    return ::testing::Matcher<T>(new StatusIsImpl<const T&>(common_));
  }

 private:
  StatusIsCommon common_;
};

template <typename StatusOrRef>
class IsOkAndHoldsImpl : public ::testing::MatcherInterface<StatusOrRef> {
 public:
  using StatusOrType = std::remove_cv_t<std::remove_reference_t<StatusOrRef>>;
  using value_type = typename StatusOrType::value_type;

  template <typename InnerMatcher>
  explicit IsOkAndHoldsImpl(InnerMatcher&& inner)
      : inner_(::testing::SafeMatcherCast<const value_type&>(
            std::forward<InnerMatcher>(inner))) {}

  void DescribeTo(std::ostream* os) const override {
    *os << "is OK and has a value that ";
    inner_.DescribeTo(os);
  }
  void DescribeNegationTo(std::ostream* os) const override {
    *os << "isn't OK or has a value that ";
    inner_.DescribeNegationTo(os);
  }
  bool MatchAndExplain(StatusOrRef actual,
                       ::testing::MatchResultListener* listener) const override {
    if (!actual.ok()) {
      *listener << "which has status " << actual.status().ToString();
      return false;
    }
    ::testing::StringMatchResultListener inner;
    const bool matches = inner_.MatchAndExplain(*actual, &inner);
    if (!inner.str().empty()) *listener << "which contains a value " << inner.str();
    return matches;
  }

 private:
  ::testing::Matcher<const value_type&> inner_;
};

template <typename InnerMatcher>
class IsOkAndHoldsMatcher {
 public:
  explicit IsOkAndHoldsMatcher(InnerMatcher inner) : inner_(std::move(inner)) {}
  template <typename StatusOrType>
  operator ::testing::Matcher<StatusOrType>() const {  // NOLINT: implicit by design
    return ::testing::Matcher<StatusOrType>(
        new IsOkAndHoldsImpl<const StatusOrType&>(inner_));
  }

 private:
  InnerMatcher inner_;
};

template <typename T>
class IsOkImpl : public ::testing::MatcherInterface<T> {
 public:
  void DescribeTo(std::ostream* os) const override { *os << "is OK"; }
  void DescribeNegationTo(std::ostream* os) const override { *os << "is not OK"; }
  bool MatchAndExplain(T actual, ::testing::MatchResultListener* listener) const override {
    const absl::Status& status = GetStatus(actual);
    if (!status.ok()) *listener << "whose status is " << status.ToString();
    return status.ok();
  }
};

class IsOkMatcher {
 public:
  template <typename T>
  operator ::testing::Matcher<T>() const {  // NOLINT: implicit by design
    return ::testing::Matcher<T>(new IsOkImpl<const T&>());
  }
};

}  // namespace internal

// Status or StatusOr whose code matches `code` and whose message matches `message`
// (a string matcher such as HasSubstr("field"), or a plain string for equality).
template <typename CodeMatcher, typename MessageMatcher>
internal::StatusIsMatcher StatusIs(CodeMatcher&& code, MessageMatcher&& message) {
  return internal::StatusIsMatcher(
      ::testing::MatcherCast<absl::StatusCode>(std::forward<CodeMatcher>(code)),
      ::testing::MatcherCast<const std::string&>(std::forward<MessageMatcher>(message)));
}

// Any message.
template <typename CodeMatcher>
internal::StatusIsMatcher StatusIs(CodeMatcher&& code) {
  return StatusIs(std::forward<CodeMatcher>(code), ::testing::_);
}

// StatusOr that is OK and whose value matches `inner` (a matcher or a plain value).
template <typename InnerMatcher>
internal::IsOkAndHoldsMatcher<std::decay_t<InnerMatcher>> IsOkAndHolds(InnerMatcher&& inner) {
  return internal::IsOkAndHoldsMatcher<std::decay_t<InnerMatcher>>(
      std::forward<InnerMatcher>(inner));
}

// Status or StatusOr that is OK.
inline internal::IsOkMatcher IsOk() { return internal::IsOkMatcher(); }

}  // namespace spgate::testing

#ifndef EXPECT_OK
#define EXPECT_OK(expr) EXPECT_THAT((expr), ::spgate::testing::IsOk())
#endif
#ifndef ASSERT_OK
#define ASSERT_OK(expr) ASSERT_THAT((expr), ::spgate::testing::IsOk())
#endif

#endif  // SPGATE_TESTS_TESTING_STATUS_MATCHERS_H_
