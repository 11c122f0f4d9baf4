// The spgatectl format tests' two protobuf helpers: a message from text format, and a
// check that a message's JSON parses back to it. One copy for both test files (they
// also meet in one unity source in the sanitizer trees).
#ifndef SPGATE_TESTS_TOOLS_SPGATECTL_PROTO_TEST_UTIL_H_
#define SPGATE_TESTS_TOOLS_SPGATECTL_PROTO_TEST_UTIL_H_

#include <string>

#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace spgate::ctl::testing {

template <typename T>
T Parse(const std::string& text) {
  T m;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &m)) << text;
  return m;
}

template <typename T>
void ExpectJsonRoundTrip(const T& message, const std::string& json) {
  T back;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &back).ok()) << json;
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(message, back))
      << message.DebugString() << "\nvs\n" << back.DebugString();
}

}  // namespace spgate::ctl::testing

#endif  // SPGATE_TESTS_TOOLS_SPGATECTL_PROTO_TEST_UTIL_H_
