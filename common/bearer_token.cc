// A bearer token's text; see bearer_token.h.
#include "common/bearer_token.h"

#include "absl/strings/str_format.h"

namespace spgate {

absl::Status CheckBearerToken(absl::string_view token, absl::string_view where) {
  if (token.empty()) return absl::InvalidArgumentError(absl::StrFormat("%s: empty token", where));
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: the token's character %d is byte 0x%02x, not printable ASCII (0x20-0x7e): a "
          "token travels in a header, where no other byte can go (the token is not shown)",
          where, i + 1, c));
    }
  }
  return absl::OkStatus();
}

absl::string_view WithoutByteOrderMark(absl::string_view text) {
  constexpr absl::string_view kMark = "\xef\xbb\xbf";
  if (text.substr(0, kMark.size()) == kMark) text.remove_prefix(kMark.size());
  return text;
}

}  // namespace spgate
