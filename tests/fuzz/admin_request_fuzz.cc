// libFuzzer harness: what an operator can send, against a scratch store (no --state_dir)
// and a live state wired as the daemon wires them (tests/server/state_harness.h), with
// job "job-a" (groups 0 and 1) registered so that pins have a job to name. Each record
// (fuzz_input.h) is parsed by its selector as
//   0: UpdateGateConfigRequest   1: PinModeRequest   2: UnpinRequest
//   3: EvaluateGatesRequest      4: a plan for job-a's group 0, step = the record's index
//   5: the clock moves on by the payload's first two bytes in seconds, then Sweep
// and goes through the calls the admin service makes. After every record the invariant
// of docs/design.md §3 must hold: the global and every job's effective config passes
// ValidateGateConfig, and the config served for a job is the effective one. A violation
// aborts (a finding); refused requests are expected.
#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "proto/convert.h"
#include "server/job_views.h"
#include "spgate/v1/admin.pb.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/server/state_harness.h"

namespace spgate::fuzz {
namespace {

using server::StateHarness;

constexpr char kJob[] = "job-a";

void CheckInvariant(StateHarness& h) {
  CheckValid(h.store->GlobalEffective(), "global");
  const v1::VersionedGateConfig global = h.store->GetGateConfig("");
  if (LayerGateConfig(GateConfig{}, global.config()) != h.store->GlobalEffective()) {
    Finding("the served global config differs from the effective one");
  }
  for (const std::string& job : h.store->JobsWithOperatorState()) {
    const server::JobOperatorView view = h.store->ViewForJob(job);
    CheckValid(view.effective, "job " + job);
    if (view.served == nullptr ||
        LayerGateConfig(GateConfig{}, view.served->config()) != view.effective) {
      Finding("job " + job + ": the served config differs from the effective one");
    }
  }
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
  for (int group : {0, 1}) {
    v1::RegisterRequest r;
    r.set_job_id(kJob);
    r.set_group(group);
    r.set_group_size(1);
    if (absl::Status s = h.Register(r).status(); !s.ok()) Finding("register: " + s.ToString());
  }

  FuzzRecords records(data, size);
  uint8_t selector = 0;
  std::string_view payload;
  int64_t index = 0;
  while (records.Next(&selector, &payload)) {
    const void* bytes = payload.data();
    const int len = static_cast<int>(payload.size());
    switch (selector % 6) {
      case 0: {
        v1::UpdateGateConfigRequest r;
        if (r.ParseFromArray(bytes, len)) (void)h.UpdateGateConfig(r);
        break;
      }
      case 1: {
        v1::PinModeRequest r;
        if (r.ParseFromArray(bytes, len)) (void)h.PinMode(r);
        break;
      }
      case 2: {
        v1::UnpinRequest r;
        if (r.ParseFromArray(bytes, len)) (void)h.Unpin(r);
        break;
      }
      case 3: {
        v1::EvaluateGatesRequest r;
        if (r.ParseFromArray(bytes, len)) (void)h.EvaluateGates(r);
        break;
      }
      case 4: {
        v1::BatchPlan plan;
        plan.set_job_id(kJob);
        plan.set_step(index);
        for (size_t i = 0; i < payload.size() && i < 64; ++i) plan.add_lengths(1 + uint8_t(payload[i]) * 16);
        v1::Decision d;
        (void)h.Decide(plan, &d);
        break;
      }
      case 5: {
        int64_t seconds = 0;
        for (size_t i = 0; i < payload.size() && i < 2; ++i) seconds |= int64_t{uint8_t(payload[i])} << (8 * i);
        now += absl::Seconds(seconds);
        h.Sweep();
        break;
      }
    }
    CheckInvariant(h);
    ++index;
  }
  (void)h.GetJob(kJob);
  (void)h.GetGateConfig(kJob);
  return 0;
}

}  // namespace
}  // namespace spgate::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return spgate::fuzz::Run(data, size);
}
