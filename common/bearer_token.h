// A bearer token's text, one rule for the daemon's token files and every client
// (docs/security.md, "Tokens"): a token travels as the value of an `authorization` header
// ("Bearer TOKEN"), where only printable ASCII (0x20-0x7e) can go. gRPC aborts the process on
// any other byte, and prints the header, token and all, as it does: so a client checks its
// token before it dials, and the daemon refuses at start-up a token no client could send.
// A file may start with a UTF-8 byte order mark (some editors write one): it is not part of
// the first line.
//
// Usage:
//   const absl::string_view text = spgate::WithoutByteOrderMark(file_text);
//   RETURN_IF_ERROR(spgate::CheckBearerToken(token, "--token_file: /etc/spgate/admin line 2"));
#ifndef SPGATE_COMMON_BEARER_TOKEN_H_
#define SPGATE_COMMON_BEARER_TOKEN_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace spgate {

// INVALID_ARGUMENT naming `where` (the option, file and line it came from) when `token` is
// empty or holds a byte outside 0x20-0x7e (a space inside is fine: a passphrase); the
// message names the byte's position and value, never the token: it is a secret.
absl::Status CheckBearerToken(absl::string_view token, absl::string_view where);

// `text` without a leading UTF-8 byte order mark (EF BB BF).
absl::string_view WithoutByteOrderMark(absl::string_view text);

}  // namespace spgate

#endif  // SPGATE_COMMON_BEARER_TOKEN_H_
