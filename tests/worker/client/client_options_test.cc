// The client's option table (worker/client/client_options.h): every row reachable by its
// C API name exactly when it is in the C API, no name shadowing a gate field or a TLS
// setting, text parsed per type with errors naming the option, the defaults as the
// C API spells them; docs/client.md's table of defaults held to the table.
#include "worker/client/client_options.h"

#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
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

// docs/client.md's table of defaults says what the option table says: each documented
// default, read in its unit (ms, s; thousands commas), equals the row's default as the C
// API spells it. A default changed in one place only fails here.
TEST(ClientOptionsTest, DocumentedDefaultsAreTheTables) {
  std::ifstream in(CLIENT_MD);
  ASSERT_TRUE(in.good()) << CLIENT_MD;
  std::string line;
  bool in_table = false;
  int checked = 0;
  while (std::getline(in, line)) {
    if (absl::StrContains(line, "The defaults below are the table's")) in_table = true;
    if (!in_table) continue;
    if (checked > 0 && !absl::StartsWith(line, "|")) break;  // the table's end
    if (!absl::StartsWith(line, "| `")) continue;
    const std::vector<std::string> cells = absl::StrSplit(line, '|');
    ASSERT_GE(cells.size(), 3u) << line;
    const std::vector<std::string> names =
        absl::StrSplit(absl::StripAsciiWhitespace(cells[1]), ", ");
    const std::vector<std::string> values =
        absl::StrSplit(absl::StripAsciiWhitespace(cells[2]), ", ");
    ASSERT_EQ(names.size(), values.size()) << line;
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string name(absl::StripPrefix(absl::StripSuffix(names[i], "`"), "`"));
      SCOPED_TRACE(name);
      const ClientOption* row = FindClientOption(name);
      ASSERT_NE(row, nullptr) << "docs/client.md documents an option the table lacks";
      std::string value = absl::StrReplaceAll(values[i], {{",", ""}});
      if (row->type == ClientOptionType::kDuration) {  // "20 ms", "5 s", "0": as ms
        double number = 0;
        std::string unit = "ms";
        const std::vector<std::string> parts = absl::StrSplit(value, ' ');
        ASSERT_TRUE(absl::SimpleAtod(parts[0], &number)) << value;
        if (parts.size() > 1) unit = parts[1];
        ASSERT_TRUE(unit == "ms" || unit == "s") << value;
        value = absl::StrCat(static_cast<int64_t>(unit == "s" ? number * 1000 : number));
      }
      EXPECT_EQ(value, ClientOptionDefaultText(*row));
      ++checked;
    }
  }
  EXPECT_GE(checked, 10) << "the table of defaults was not found in " << CLIENT_MD;
}

}  // namespace
}  // namespace spgate::client
