// The client's option table (worker/client/client_options.h): every row reachable by its
// C API name exactly when it is in the C API, no name shadowing a gate field or a TLS
// setting, text parsed per type with errors naming the option, and the defaults as the
// C API spells them.
#include "worker/client/client_options.h"

#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/gate_config.h"
#include "tests/testing/status_matchers.h"

namespace spgate::client {
namespace {

using ::spgate::testing::StatusIs;

TEST(ClientOptionsTest, EveryRowHasOneNameAndHelp) {
  std::set<std::string> names;
  for (const ClientOption& row : kClientOptions) {
    SCOPED_TRACE(std::string(row.name));
    EXPECT_TRUE(names.insert(CApiOptionName(row)).second) << "duplicate name";
    EXPECT_FALSE(row.help.empty());
    EXPECT_EQ(FindClientOption(row.name), &row);
    EXPECT_EQ(FindCApiOption(CApiOptionName(row)), row.in_c_api() ? &row : nullptr);
    // The C API also takes the gate fields and tls_* by name: no row may shadow them.
    EXPECT_EQ(FindGateField(CApiOptionName(row)), nullptr);
    EXPECT_NE(CApiOptionName(row).rfind("tls_", 0), 0u);
  }
  EXPECT_EQ(FindClientOption("no_such_option"), nullptr);
  EXPECT_EQ(FindCApiOption("decision_deadline"), nullptr);  // durations are _ms there
  EXPECT_EQ(FindCApiOption("max_pending_plans"), nullptr);  // C++ only
}

TEST(ClientOptionsTest, DefaultsAsTheCApiSpellsThem) {
  struct Case {
    const char* name;
    const char* text;
  };
  const Case cases[] = {
      {"controller", ""},
      {"group_size", "1"},
      {"decision_deadline", "20"},  // ms
      {"rpc_timeout", "2000"},
      {"initial_backoff", "100"},
      {"max_backoff", "5000"},
      {"telemetry_buffer", "4096"},
      {"backoff_jitter", "0.2"},
      {"rs_wait_from_own_telemetry", "true"},
      {"layers", "0"},
  };
  for (const Case& c : cases) {
    const ClientOption* row = FindClientOption(c.name);
    ASSERT_NE(row, nullptr) << c.name;
    EXPECT_EQ(ClientOptionDefaultText(*row), c.text) << c.name;
  }
  EXPECT_EQ(GateClientOptions{}.decision_deadline, absl::Milliseconds(20));
  EXPECT_STREQ(ClientOptionHelp("no_such_option"), "");
}

TEST(ClientOptionsTest, SetFromTextPerType) {
  struct Case {
    const char* c_name;
    const char* text;
    const char* read_back;  // null: INVALID_ARGUMENT with `error`
    const char* error;
  };
  const Case cases[] = {
      {"job_id", "llama", "llama", nullptr},
      {"group_size", "8", "8", nullptr},
      {"group_size", "two", nullptr, "group_size: not an integer: \"two\""},
      {"seed", "42", "42", nullptr},
      {"memory_budget_bytes", "1.5", nullptr, "memory_budget_bytes: not an integer"},
      {"decision_deadline_ms", "50", "50", nullptr},
      {"decision_deadline_ms", "0.5", nullptr, "decision_deadline_ms: not an integer"},
      {"heads", "16", "16", nullptr},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.c_name, "=", c.text));
    const ClientOption* row = FindCApiOption(c.c_name);
    ASSERT_NE(row, nullptr);
    GateClientOptions o;
    if (c.read_back == nullptr) {
      EXPECT_THAT(SetClientOptionFromText(o, *row, c.text),
                  StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr(c.error)));
    } else {
      ASSERT_OK(SetClientOptionFromText(o, *row, c.text));
      EXPECT_EQ(ClientOptionText(o, *row), c.read_back);
    }
  }
  // The C++-only types, through their rows.
  GateClientOptions o;
  ASSERT_OK(SetClientOptionFromText(o, *FindClientOption("backoff_jitter"), "0.5"));
  EXPECT_EQ(o.backoff_jitter, 0.5);
  EXPECT_THAT(SetClientOptionFromText(o, *FindClientOption("backoff_jitter"), "inf"),
              StatusIs(absl::StatusCode::kInvalidArgument, "backoff_jitter: not a number: \"inf\""));
  ASSERT_OK(SetClientOptionFromText(o, *FindClientOption("rs_wait_from_own_telemetry"), "false"));
  EXPECT_FALSE(o.rs_wait_from_own_telemetry);
  ASSERT_OK(SetClientOptionFromText(o, *FindClientOption("hidden"), "4096"));
  EXPECT_EQ(o.model.hidden, 4096);  // the model rows reach the nested struct
}

}  // namespace
}  // namespace spgate::client
