// Defaults shared by the daemon's options, its flags and its live state, so each is
// written once. The limits are explained in docs/design.md §10 ("Limits").
#ifndef SPGATE_SERVER_DEFAULTS_H_
#define SPGATE_SERVER_DEFAULTS_H_

#include <cstdint>

#include "absl/time/time.h"

namespace spgate::server {

// Decisions each TP group keeps for idempotent retries (the newest ones; a retry of an
// older step is refused, and the worker decides it locally). A worker re-sends a plan only
// while that step is undecided on its side, within the plan lead (16 steps), so this is 8
// times that; a leader restarted within its launch also gets these answers again. The
// cache grows with use up to this size, 72 bytes a decision (CachedDecision): 9 KiB a
// group, 18 MiB for 2,048 groups (it was 512 decisions of 136 bytes, 143 MiB, the largest
// item of a 16,384-rank job's daemon; docs/benchmarks.md).
inline constexpr int64_t kDefaultDecisionCacheSteps = 128;

// TP groups one job may register, and how far ahead of a group's last decided step a
// plan may be. Further is refused: a far-future plan would make the group's real plans
// for the steps before it "not after the last decided step". The shipped clients plan
// one step ahead (the plan for step N+1 while step N runs), so 16 leaves room for a
// trainer that skips a few step numbers and bounds what one bad plan can cost the group
// to 15 steps decided locally (docs/design.md §10).
inline constexpr int kDefaultMaxGroupsPerJob = 4096;
inline constexpr int64_t kDefaultMaxPlanLeadSteps = 16;

// --- Limits: what one client can make the daemon hold or do (docs/design.md §10) ---
// The largest message either gRPC port accepts. A plan of the most sequences allowed
// below takes at most 3 bytes a length on the wire (lengths are at most 2^24).
inline constexpr int kDefaultMaxReceiveMessageBytes = 4 << 20;
// HTTP/2 streams one connection may have open at once (a worker process needs one
// Connect stream and a few unary calls).
inline constexpr int kDefaultMaxConcurrentStreamsPerConnection = 64;
// Connect and WatchDecisions streams open at once over the whole daemon.
inline constexpr int kDefaultMaxStreams = 16384;
inline constexpr int kDefaultMaxWatchStreams = 64;
// A Connect stream must name its session in its first message within this long, or it
// is ended (DEADLINE_EXCEEDED): a shipped client sends it as the stream opens.
inline constexpr absl::Duration kDefaultFirstMessageTimeout = absl::Seconds(10);
// A connection must finish its TLS handshake and send HTTP/2's preface and SETTINGS
// within this long, or it is closed: a socket that never speaks does not hold a file
// descriptor for gRPC's default two minutes.
inline constexpr absl::Duration kDefaultHandshakeTimeout = absl::Seconds(10);
// Worker sessions (registered ranks) one job may hold.
inline constexpr int kDefaultMaxSessionsPerJob = 16384;
// Sequences in one batch plan (the policy's own bound on a batch is 2^20).
inline constexpr int kDefaultMaxSequencesPerPlan = 65536;
// Per session: plans and telemetry records a second, with bursts of twice that. A
// leader plans once a step and a rank reports once a step; the bursts cover a client
// re-sending its pending plans (at most 1024) and telemetry buffer (4096) on reconnect.
inline constexpr double kDefaultMaxPlansPerSecond = 1000;
inline constexpr double kDefaultMaxTelemetryPerSecond = 5000;
// Pings a client may send without data: at least this far apart (the shipped clients
// ping every 10 s), and how many closer ones the daemon forgives before it closes the
// connection (GOAWAY, "too_many_pings").
inline constexpr int kDefaultMinPingIntervalMs = 5000;
inline constexpr int kDefaultMaxPingStrikes = 2;

}  // namespace spgate::server

#endif  // SPGATE_SERVER_DEFAULTS_H_
