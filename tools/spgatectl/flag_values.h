// Parsers for spgatectl's flag values. Each one takes the flag's name so that a bad
// value is refused with a message that names the flag ("--for: \"10 minutes\" is not a
// duration (e.g. 10m, 1h30m, 2d)"). They check only what the client can know (syntax);
// ranges are the server's to judge, and its message names the field.
//
// Usage:
//   absl::StatusOr<absl::Duration> d = spgate::ctl::ParseDurationFlag("for", "10m");
//   absl::StatusOr<uint64_t> b = spgate::ctl::ParseBytesFlag("budget", "80GiB");
#ifndef SPGATE_TOOLS_SPGATECTL_FLAG_VALUES_H_
#define SPGATE_TOOLS_SPGATECTL_FLAG_VALUES_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "spgate/v1/gate.pb.h"

namespace spgate::ctl {

// A decimal number ("0.2", "1e-3"). "nan" and "inf" parse; the server refuses them.
absl::StatusOr<double> ParseDoubleFlag(absl::string_view flag, absl::string_view value);
absl::StatusOr<int64_t> ParseInt64Flag(absl::string_view flag, absl::string_view value);
absl::StatusOr<int32_t> ParseInt32Flag(absl::string_view flag, absl::string_view value);

// A boolean flag's value: "true" / "1" or "false" / "0". A bare flag ("--force") reads
// "true" (the command table declares it without a value).
absl::StatusOr<bool> ParseBoolFlag(absl::string_view flag, absl::string_view value);

// A config version (`gates set/rollback --expected_version`, `--to_version`): an integer,
// 0 or more (ValidateConfigVersion, the daemon's rule).
absl::StatusOr<int64_t> ParseVersionFlag(absl::string_view flag, absl::string_view value);

// A byte count: plain bytes, or a number with a unit: B, KiB, MiB, GiB, TiB (powers of
// 1024) or KB, MB, GB, TB (powers of 1000). Case-insensitive units; "1.5GiB" is fine.
absl::StatusOr<uint64_t> ParseBytesFlag(absl::string_view flag, absl::string_view value);

// A Go-style duration as absl::ParseDuration reads it ("10m", "1h30m", "250ms"), or
// whole days ("2d"). Must be finite.
absl::StatusOr<absl::Duration> ParseDurationFlag(absl::string_view flag, absl::string_view value);

// "sp" (sequence parallel) or "tp" / "tp_only" (tensor parallel only).
absl::StatusOr<v1::Mode> ParseModeFlag(absl::string_view flag, absl::string_view value);

// Comma-separated integers ("512,4096,16384"); at least one.
absl::StatusOr<std::vector<int64_t>> ParseInt64ListFlag(absl::string_view flag,
                                                       absl::string_view value);

// Comma-separated GateConfig field names ("max_length_cv,window_steps"); each must be a
// field of spgate.v1.GateConfig.
absl::StatusOr<std::vector<std::string>> ParseGateFieldListFlag(absl::string_view flag,
                                                               absl::string_view value);

// The bearer token in a --token_file's text: its first line that is neither empty nor a
// '#' comment, without a leading "NAME:" (NAME of [A-Za-z0-9._@-]), so the daemon's
// token-file lines work as they are (docs/security.md); a leading UTF-8 byte order mark is
// not text. Empty, or a byte a header cannot carry (CheckBearerToken): INVALID_ARGUMENT.
absl::StatusOr<std::string> TokenFromFileText(absl::string_view path, absl::string_view text);

// Human byte count for tables: "512 B", "1.5 KiB", "79.2 GiB".
std::string FormatBytes(uint64_t bytes);

}  // namespace spgate::ctl

#endif  // SPGATE_TOOLS_SPGATECTL_FLAG_VALUES_H_
