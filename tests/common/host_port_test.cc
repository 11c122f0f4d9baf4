// The one reading of a gRPC address (common/host_port.h), table-driven: the parts the
// daemon's listen flags and the clients' controller address are both checked on.
#include "common/host_port.h"

#include "gtest/gtest.h"

namespace spgate {
namespace {

TEST(HostPortTest, SplitsAtTheLastColon) {
  const struct {
    const char* address;
    const char* host;
    const char* port;
    bool bracketed, has_colon, unix;
    int number;  // PortNumber
  } cases[] = {
      {"127.0.0.1:50061", "127.0.0.1", "50061", false, true, false, 50061},
      {"[::1]:65535", "::1", "65535", true, true, false, 65535},
      {"spgated.train.svc:0", "spgated.train.svc", "0", false, true, false, 0},
      {":50061", "", "50061", false, true, false, 50061},
      {"9461", "", "9461", false, false, false, 9461},  // civetweb's bare port
      // Unbracketed IPv6: split as any, the caller's to refuse.
      {"::1:50061", "::1", "50061", false, true, false, 50061},
      {"[::1]", "[:", "1]", false, true, false, -1},  // no port: the caller's to refuse
      {"127.0.0.1:", "127.0.0.1", "", false, true, false, -1},
      {"127.0.0.1:70000", "127.0.0.1", "70000", false, true, false, -1},
      {"127.0.0.1:-1", "127.0.0.1", "-1", false, true, false, -1},
      {"127.0.0.1:0x50", "127.0.0.1", "0x50", false, true, false, -1},
      {"127.0.0.1:99999999999", "127.0.0.1", "99999999999", false, true, false, -1},
      {"unix:/run/spgated.sock", "", "", false, false, true, -1},
      {"unix-abstract:spgated", "", "", false, false, true, -1},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.address);
    const AddressParts p = SplitAddress(c.address);
    EXPECT_EQ(p.host, c.host);
    EXPECT_EQ(p.port, c.port);
    EXPECT_EQ(p.bracketed, c.bracketed);
    EXPECT_EQ(p.has_colon, c.has_colon);
    EXPECT_EQ(p.unix, c.unix);
    EXPECT_EQ(PortNumber(p), c.number);
  }
}

}  // namespace
}  // namespace spgate
