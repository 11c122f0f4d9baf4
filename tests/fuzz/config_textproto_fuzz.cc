// libFuzzer harness: the --config loader (server/persistence.h) over arbitrary text.
// LoadGateConfigFile reads the file and hands its text to ParseGateConfigText, which is
// what runs here. Either the text is refused with INVALID_ARGUMENT naming the source, or
// the config it yields is valid layered over the defaults (docs/design.md §3) and
// survives a print/parse round trip unchanged. Anything else aborts (a finding).
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "google/protobuf/text_format.h"
#include "proto/convert.h"
#include "server/persistence.h"
#include "tests/fuzz/fuzz_input.h"

namespace spgate::fuzz {
namespace {

constexpr char kSource[] = "fuzz.textproto";

int Run(const uint8_t* data, size_t size) {
  QuietProtobufLogs();
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<v1::GateConfig> config = server::ParseGateConfigText(kSource, text);
  if (!config.ok()) {
    if (config.status().code() != absl::StatusCode::kInvalidArgument ||
        config.status().message().find(kSource) == std::string_view::npos) {
      Finding("unclear error: " + config.status().ToString());
    }
    return 0;
  }
  const GateConfig effective = LayerGateConfig(GateConfig{}, *config);
  CheckValid(effective, "loaded --config");
  std::string printed;
  if (!google::protobuf::TextFormat::PrintToString(*config, &printed)) Finding("cannot print");
  absl::StatusOr<v1::GateConfig> again = server::ParseGateConfigText(kSource, printed);
  if (!again.ok()) Finding("printed config does not load again: " + again.status().ToString());
  if (LayerGateConfig(GateConfig{}, *again) != effective) Finding("round trip changed the config");
  return 0;
}

}  // namespace
}  // namespace spgate::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return spgate::fuzz::Run(data, size);
}
