// TlsRefusalHint: the words for gRPC's "Socket closed" on a connection never answered
// (a TLS port refusing the client), and nothing for any other failure.
#include "common/handshake_hint.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace spgate {
namespace {

using ::testing::HasSubstr;

TEST(TlsRefusalHint, OnlyForAConnectionClosedBeforeAnAnswer) {
  const std::string refused =
      "Register: UNAVAILABLE: failed to connect to all addresses; last error: UNAVAILABLE: "
      "ipv4:127.0.0.1:50061: Socket closed";
  EXPECT_THAT(TlsRefusalHint(refused, false, ""),
              HasSubstr("this client spoke plaintext (no tls_ca, tls_cert) and the port speaks TLS"));
  EXPECT_THAT(TlsRefusalHint(refused, true, "--"),
              HasSubstr("a client certificate missing (--tls_cert, --tls_key) or not signed by "
                        "the daemon's --tls_client_ca"));
  EXPECT_THAT(TlsRefusalHint(refused, std::nullopt, ""),
              HasSubstr("this client spoke plaintext (no tls_ca, tls_cert) and the port speaks "
                        "TLS, or a client certificate missing (tls_cert, tls_key)"));
  EXPECT_EQ(TlsRefusalHint("failed to connect to all addresses; last error: UNAVAILABLE: "
                           "ipv4:127.0.0.1:1: Connection refused", true, ""),
            "")
      << "no daemon there";
  EXPECT_EQ(TlsRefusalHint("Socket closed", true, ""), "")
      << "a stream ended after it had been answered";
  EXPECT_EQ(TlsRefusalHint("", false, ""), "");
}

}  // namespace
}  // namespace spgate
