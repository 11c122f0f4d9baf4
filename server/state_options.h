// The live state's options (server/gate_state.h), a header of their own so that
// DaemonOptions (server/daemon.h) can embed them without the state's includes.
#ifndef SPGATE_SERVER_STATE_OPTIONS_H_
#define SPGATE_SERVER_STATE_OPTIONS_H_

#include <cstdint>
#include <functional>

#include "absl/time/time.h"
#include "server/defaults.h"

namespace spgate::server {

struct StateOptions {
  // Injected clock, for tests; empty: absl::Now.
  std::function<absl::Time()> clock;
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration stale_after = absl::Seconds(5);
  // Ranks silent this long (with no stream), groups without ranks and jobs without
  // groups are dropped; a job with operator settings keeps only those.
  absl::Duration forget_after = absl::Minutes(30);
  int64_t decision_cache_steps = kDefaultDecisionCacheSteps;
  int max_jobs = 1024;
  int max_groups_per_job = kDefaultMaxGroupsPerJob;
  int max_group_size = 1024;
  // Limits (docs/design.md §10); each refusal is RESOURCE_EXHAUSTED and counted in
  // spgate_limit_refusals_total. A rate <= 0 turns that limit off.
  int max_sessions_per_job = kDefaultMaxSessionsPerJob;
  int max_sequences_per_plan = kDefaultMaxSequencesPerPlan;
  double max_plans_per_second = kDefaultMaxPlansPerSecond;          // per session
  double max_telemetry_per_second = kDefaultMaxTelemetryPerSecond;  // records, per session
  int64_t config_lead_steps = 2;
  // A plan more than this many steps after its group's last decided step is refused
  // (INVALID_ARGUMENT, no state change): one bad plan cannot take a group away from the
  // daemon. Must exceed the workers' pipelining depth.
  int64_t max_plan_lead_steps = kDefaultMaxPlanLeadSteps;
  // At most one learned-table push per job per this interval (docs/design.md §11).
  absl::Duration learned_push_interval = absl::Seconds(1);
};

}  // namespace spgate::server

#endif  // SPGATE_SERVER_STATE_OPTIONS_H_
