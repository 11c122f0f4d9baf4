// The live state's options (server/gate_state.h), a header of their own so that
// DaemonOptions (server/daemon.h) can embed them without the state's includes.
#ifndef SPGATE_SERVER_STATE_OPTIONS_H_
#define SPGATE_SERVER_STATE_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/time/time.h"
#include "common/registration.h"
#include "server/defaults.h"

namespace spgate::server {

// How often a learning job's tables go to --state_dir at most: a kill -9 loses at most
// this much learning (3-30 steps at 1-10 s a step, against a half-life of 2,000), and
// --max_jobs learning jobs cost at most 1,024 / 30 s = 34 small files written a second.
inline constexpr absl::Duration kDefaultLearnedPersistInterval = absl::Seconds(30);

struct StateOptions {
  // Injected clock, for tests; empty: absl::Now.
  std::function<absl::Time()> clock;
  // Where the job launches are persisted (persistence.h, kLaunchesFileName); empty: in
  // memory only, so a restart forgets who owns each job id.
  std::string state_dir;
  // The state_dir is read, never written (--allow_read_only_state_dir over a directory the
  // daemon cannot write): launches are granted in memory only, learned tables not saved.
  bool read_only_state_dir = false;
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration stale_after = absl::Seconds(5);
  // After a restart, a launch read back from the launches file holds its job this long
  // (or until its ranks are heard from) even though no rank of it is known yet: its
  // clients reconnect within their backoff (at most 6 s with the shipped defaults), and
  // no other launch may take the job in that window (docs/security.md).
  absl::Duration restored_launch_hold = absl::Seconds(15);
  // Ranks silent this long (with no stream), groups without ranks and jobs without
  // groups are dropped; a job with operator settings keeps only those.
  absl::Duration forget_after = absl::Minutes(30);
  int64_t decision_cache_steps = kDefaultDecisionCacheSteps;
  int max_jobs = 1024;
  int max_groups_per_job = kDefaultMaxGroupsPerJob;
  int max_group_size = kMaxGroupSize;  // the clients check the same (common/registration.h)
  // Limits (docs/design.md §10); each refusal is RESOURCE_EXHAUSTED and counted in
  // spgate_limit_refusals_total. A rate <= 0 turns that limit off.
  int max_sessions_per_job = kDefaultMaxSessionsPerJob;
  int max_sequences_per_plan = kDefaultMaxSequencesPerPlan;
  double max_plans_per_second = kDefaultMaxPlansPerSecond;          // per session
  double max_telemetry_per_second = kDefaultMaxTelemetryPerSecond;  // records, per session
  int64_t config_lead_steps = 2;
  // A plan more than this many steps after its group's last decided step is refused
  // (INVALID_ARGUMENT, no state change), unless the group's leader has just (re)attached
  // or the group was silent for stale_after (docs/design.md §10, "Steps a group can be
  // at"). Must exceed the workers' pipelining depth (the shipped clients plan one step
  // ahead).
  int64_t max_plan_lead_steps = kDefaultMaxPlanLeadSteps;
  // At most one learned-table push per job per this interval (docs/design.md §11).
  absl::Duration learned_push_interval = absl::Seconds(1);
  // With a state_dir: a job's learned tables are written to it (server/learned_store.h)
  // at most once per this interval while it learns, from the sweep thread, and at
  // shutdown; a kill -9 loses at most this much learning (docs/operations.md).
  absl::Duration learned_persist_interval = kDefaultLearnedPersistInterval;
  // Where the state's own log lines go (refused learned-table files); empty: standard
  // error, prefixed "spgated: ".
  std::function<void(const std::string&)> log;
  // A failed write to state_dir (the launches file, a learned table), naming the file:
  // the daemon's one report of every failed write (the operator store's too). Empty:
  // counted in spgate_state_persist_failures_total and given to `log`.
  std::function<void(absl::string_view what)> on_persist_failure;
};

}  // namespace spgate::server

#endif  // SPGATE_SERVER_STATE_OPTIONS_H_
