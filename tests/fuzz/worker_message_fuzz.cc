// libFuzzer harness: what a worker can send, against a live state. Each input is a short
// session (fuzz_input.h records) against a fresh store + state wired as the daemon wires
// them (tests/server/state_harness.h): a leader and a second rank of job "job-a", group
// 0, are registered first; then each record is parsed by its selector as
//   0, 1: a WorkerMessage applied as the leader's (0) or the other rank's (1) session,
//         the way the Connect reactor does (services.cc): its session_id, when set, is
//         looked up; plans -> Decide, telemetry -> RecordTelemetry, heartbeat -> Heartbeat
//   2:    a DecideRequest (the unary Decide: the session named, else the leader's)
//   3:    a RegisterRequest (another rank, group, job or launch)
//   4:    the clock moves on by the payload's first two bytes in 10 ms units, then Sweep
// through the services' own conversions (server/job_views.h). Nothing may crash and no
// sanitizer may fire; errors are expected. The admin views of the job run at the end.
#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "server/job_views.h"
#include "spgate/v1/gate.pb.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/server/state_harness.h"

namespace spgate::fuzz {
namespace {

using server::Session;
using server::StateHarness;

constexpr char kJob[] = "job-a";

std::shared_ptr<Session> RegisterRank(StateHarness& h, int rank) {
  v1::RegisterRequest r;
  r.set_job_id(kJob);
  r.set_group(0);
  r.set_rank_in_group(rank);
  r.set_group_size(2);
  r.set_global_rank(rank);
  absl::StatusOr<v1::RegisterResponse> resp = h.Register(r);
  if (!resp.ok()) Finding("cannot register rank " + std::to_string(rank) + ": " + resp.status().ToString());
  absl::StatusOr<std::shared_ptr<Session>> s = h.state->FindSession(resp->session_id());
  if (!s.ok()) Finding("registered session not found: " + s.status().ToString());
  return *s;
}

void ApplyWorkerMessage(StateHarness& h, std::shared_ptr<Session> session,
                        const v1::WorkerMessage& m) {
  if (!m.session_id().empty()) {
    absl::StatusOr<std::shared_ptr<Session>> named = h.state->FindSession(m.session_id());
    if (!named.ok()) return;  // the reactor ends the stream
    session = *named;
  }
  for (const v1::BatchPlan& plan : m.plans()) {
    (void)h.state->Decide(*session, server::PlanFromProto(plan));
  }
  for (const v1::StepTelemetry& t : m.telemetry()) (void)h.RecordTelemetry(*session, t);
  if (m.has_heartbeat()) (void)h.Heartbeat(*session, m.heartbeat());
}

int Run(const uint8_t* data, size_t size) {
  QuietProtobufLogs();
  absl::Time now = absl::FromUnixSeconds(1'700'000'000);
  server::StateOptions options;
  options.clock = [&now] { return now; };
  absl::StatusOr<std::unique_ptr<StateHarness>> harness =
      StateHarness::Create(options, server::StoreOptions{}, &server::SharedMetrics());
  if (!harness.ok()) Finding("harness: " + harness.status().ToString());
  StateHarness& h = **harness;
  std::shared_ptr<Session> leader = RegisterRank(h, 0);
  std::shared_ptr<Session> other = RegisterRank(h, 1);

  FuzzRecords records(data, size);
  uint8_t selector = 0;
  std::string_view payload;
  while (records.Next(&selector, &payload)) {
    switch (selector % 5) {
      case 0:
      case 1: {
        v1::WorkerMessage m;
        if (!m.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) break;
        ApplyWorkerMessage(h, selector % 5 == 0 ? leader : other, m);
        break;
      }
      case 2: {
        v1::DecideRequest r;
        if (!r.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) break;
        std::shared_ptr<Session> session = leader;
        if (!r.session_id().empty()) {
          absl::StatusOr<std::shared_ptr<Session>> named = h.state->FindSession(r.session_id());
          if (!named.ok()) break;
          session = *named;
        }
        (void)h.state->Decide(*session, server::PlanFromProto(r.plan()));
        break;
      }
      case 3: {
        v1::RegisterRequest r;
        if (!r.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) break;
        (void)h.Register(r);
        break;
      }
      case 4: {
        int64_t ticks = 0;
        for (size_t i = 0; i < payload.size() && i < 2; ++i) ticks |= int64_t{uint8_t(payload[i])} << (8 * i);
        now += absl::Milliseconds(10 * ticks);
        h.Sweep();
        break;
      }
    }
  }
  (void)h.GetJob(kJob);
  (void)h.ListJobs();
  (void)h.GetGateConfig(kJob);
  return 0;
}

}  // namespace
}  // namespace spgate::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return spgate::fuzz::Run(data, size);
}
