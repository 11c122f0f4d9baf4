// Every test binary that runs gRPC in-process ends with gRPC shut down (linked into a
// test by spgate_test's GRPC option, cmake/spgate_helpers.cmake).
//
// gRPC tears a closed connection, its TLS state and finally the library itself down
// on its own threads. When the last reference goes on one of them, grpc_shutdown hands
// the clean-up to a detached thread; if main() returns first, LeakSanitizer's check at
// exit finds OpenSSL objects those threads still held and fails a binary whose tests
// all passed (seen once in CI on call_credentials_test: 7,680 bytes from
// CRYPTO_zalloc/CRYPTO_strdup; not reproduced in 260 runs here, loaded or idle;
// grpc/grpc#38539 describes the same exit race). After the last test, this
// environment waits until every gRPC object has let the library go and its clean-up
// has finished. A gRPC object that outlives the tests is a test bug: it fails the
// binary by name after the wait instead of leaving LeakSanitizer a race.
#include <grpc/grpc.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace spgate::testing {
namespace {

// Long enough for a loaded CI machine to close its connections; a test binary never
// waits this long unless an object really outlives its tests. Not a hard cap: the check
// waits for the library's lock while a clean-up holds it, and gRPC's own clean-up waits up
// to 10 s for its objects; ctest's per-test timeout bounds the rest.
constexpr absl::Duration kQuiesceDeadline = absl::Seconds(20);

class GrpcQuiesce : public ::testing::Environment {
 public:
  void TearDown() override {
    // grpc_is_initialized takes the library's init lock, which its clean-up holds to the
    // end, so false means the clean-up has finished (or gRPC never started).
    const absl::Time deadline = absl::Now() + kQuiesceDeadline;
    while (grpc_is_initialized() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(2));
    }
    EXPECT_FALSE(grpc_is_initialized())
        << "gRPC is still initialized " << kQuiesceDeadline
        << " after the last test: a channel, server, stub or completion queue outlives the "
           "tests (a static, or a leak), or a channel was destroyed while it waited to "
           "reconnect (gRPC 1.51 keeps the library up until that backoff ends: cap it with "
           "GRPC_ARG_MAX_RECONNECT_BACKOFF_MS)";
  }
};

[[maybe_unused]] ::testing::Environment* const kRegistered =
    ::testing::AddGlobalTestEnvironment(new GrpcQuiesce);

}  // namespace
}  // namespace spgate::testing
