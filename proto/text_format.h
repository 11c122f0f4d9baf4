// Reading a message in protobuf text format with an error that says where: the daemon's
// config and state files and spgate-sim's --config all go through it, so a bad file is
// refused with the line and column of its first mistake, not a bare "parse error" (the
// library's own log line is not the message a caller shows).
//
// Usage:
//   spgate::v1::GateConfig c;
//   RETURN_IF_ERROR(spgate::ParseTextFormat(text, &c));
//   // INVALID_ARGUMENT "not a valid spgate.v1.GateConfig in text format: line 3 column 1:
//   //   Message type "spgate.v1.GateConfig" has no field named "max_cv"."
#ifndef SPGATE_PROTO_TEXT_FORMAT_H_
#define SPGATE_PROTO_TEXT_FORMAT_H_

#include <string>

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "google/protobuf/text_format.h"

namespace spgate {

// Parses `text` into `out` (cleared first). On failure INVALID_ARGUMENT naming the message
// type and the first error's line and column (1-based); `locations`, when given, receives
// where each field was read.
absl::Status ParseTextFormat(const std::string& text, google::protobuf::Message* out,
                             google::protobuf::TextFormat::ParseInfoTree* locations = nullptr);

}  // namespace spgate

#endif  // SPGATE_PROTO_TEXT_FORMAT_H_
