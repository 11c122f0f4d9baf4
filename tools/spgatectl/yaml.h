// spgatectl's `-o yaml`: the JSON that `-o json` prints, re-emitted as block-style YAML
// with the same keys in the same order, so the two formats can never say different
// things. Strings stay double-quoted with JSON's escapes (valid YAML), numbers, true,
// false and null are copied as they are; protobuf's JSON mapping already writes 64-bit
// integers as strings.
//
// Usage:
//   absl::StatusOr<std::string> y = spgate::ctl::JsonToYaml(R"({"a": [1, {"b": "x"}]})");
//   // "a:\n  - 1\n  - b: \"x\"\n"
#ifndef SPGATE_TOOLS_SPGATECTL_YAML_H_
#define SPGATE_TOOLS_SPGATECTL_YAML_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace spgate::ctl {

// INVALID_ARGUMENT naming the offset when `json` is not one well-formed JSON value.
absl::StatusOr<std::string> JsonToYaml(absl::string_view json);

}  // namespace spgate::ctl

#endif  // SPGATE_TOOLS_SPGATECTL_YAML_H_
