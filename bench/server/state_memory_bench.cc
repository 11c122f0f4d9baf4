// What the daemon's live state holds per TP group and per registered rank, measured as
// the growth of the heap in use (glibc's mallinfo2) while a GateState (no gRPC) takes a
// job of --groups groups of --tp ranks through the stages a job goes through:
//   1. every group's leader registers a group session (the clients' default);
//   2. every group decides --steps steps (plans of --sequences lengths) and reports each
//      step's group telemetry: the decision cache, the rolling windows and the metric
//      series fill up (the cache holds decision_cache_steps decisions, 512 by default);
//   3. every other rank registers a session of its own (group_session=false, the old way).
// Each stage's growth is divided by what it added (groups, group steps, ranks). The gRPC
// side (a connection and a Connect stream per session) is not here: bench/sim_scale.sh
// measures the whole process. Deterministic; a few seconds.
//
//   build/bin/state_memory_bench --groups=2048 --tp=8 --steps=512 --out=state_memory.json
#include <malloc.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "server/defaults.h"
#include "server/gate_state.h"
#include "server/metrics.h"
#include "server/operator_store.h"

ABSL_FLAG(int, groups, 2048, "TP groups of the job");
ABSL_FLAG(int, tp, 8, "Ranks per group");
ABSL_FLAG(int, steps, 512, "Steps each group decides and reports");
ABSL_FLAG(int, sequences, 64, "Sequences per plan");
ABSL_FLAG(std::string, out, "", "Write the figures as JSON here");

namespace {

using namespace spgate;          // NOLINT: a benchmark's main
using namespace spgate::server;  // NOLINT

size_t HeapInUse() { return mallinfo2().uordblks; }

int Fail(const absl::Status& s, const char* what) {
  std::fprintf(stderr, "state_memory_bench: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int groups = absl::GetFlag(FLAGS_groups);
  const int tp = absl::GetFlag(FLAGS_tp);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int sequences = absl::GetFlag(FLAGS_sequences);
  if (groups < 1 || tp < 2 || steps < 1 || sequences < 1) {
    std::fprintf(stderr, "state_memory_bench: --groups, --steps, --sequences >= 1, --tp >= 2\n");
    return 2;
  }
  // A clock that moves 1 ms a call: no rate limit is hit, no rank goes stale.
  auto now = std::make_shared<absl::Time>(absl::FromUnixSeconds(1700000000));
  StateOptions options;
  options.clock = [now] { return *now += absl::Milliseconds(1); };
  options.max_sessions_per_job = groups * tp;
  options.max_groups_per_job = groups;
  options.stale_after = absl::Hours(24);
  options.forget_after = absl::Hours(48);
  options.max_plans_per_second = 1e9;
  options.max_telemetry_per_second = 1e9;
  Metrics metrics;
  StoreOptions store_options;
  store_options.clock = options.clock;
  auto store = OperatorStore::Create(std::move(store_options), {});
  if (!store.ok()) return Fail(store.status(), "operator store");
  auto state = GateState::Create(options, metrics, store->get());
  if (!state.ok()) return Fail(state.status(), "state");
  (*store)->SetListener(state->get());

  double metric_bytes = 0;
  const std::string job = "memory-bench";
  // The group's metric series alone (GroupMetrics: 7 labelled series), made and dropped.
  const size_t m0 = HeapInUse();
  {
    std::vector<std::unique_ptr<GroupMetrics>> series;
    for (int g = 0; g < groups; ++g) {
      series.push_back(std::make_unique<GroupMetrics>(metrics, "series-probe", g));
    }
    const double per = static_cast<double>(HeapInUse() - m0) / groups;
    std::printf("  (a group's metric series alone: %.0f bytes)\n", per);
    metric_bytes = per;
  }
  RegisterInput reg{.job_id = job, .incarnation = "launch-1", .group_size = tp,
                    .launch_credential = "memory-bench-credential-0001"};
  const size_t h0 = HeapInUse();  // after the probe's series are gone
  std::vector<std::shared_ptr<Session>> leaders;
  for (int g = 0; g < groups; ++g) {
    reg.group = g;
    reg.rank_in_group = 0;
    reg.global_rank = g * tp;
    reg.host = absl::StrFormat("node-%05d", g);
    reg.group_session = true;
    auto r = (*state)->Register(reg);
    if (!r.ok()) return Fail(r.status(), "register a leader");
    auto s = (*state)->FindSession(r->session_id);
    if (!s.ok()) return Fail(s.status(), "find a session");
    leaders.push_back(*std::move(s));
  }
  const size_t h1 = HeapInUse();

  std::vector<int64_t> lengths(static_cast<size_t>(sequences));
  int64_t tokens = 0;  // a record claims at most its plan's tokens
  for (int i = 0; i < sequences; ++i) {
    lengths[i] = 512 + 97 * i % 1500;
    tokens += lengths[i];
  }
  for (int k = 0; k < steps; ++k) {
    for (int g = 0; g < groups; ++g) {
      auto d = (*state)->Decide(*leaders[g], {.job_id = job, .group = g, .step = k,
                                              .lengths = lengths});
      if (!d.ok()) return Fail(d.status(), "decide");
      TelemetryRecord t{.job_id = job, .group = g, .rank_in_group = 0,
                        .values = {.step = k, .mode = static_cast<int32_t>(d->mode),
                                   .step_time_s = 1.0, .rs_wait_s = 0.05,
                                   .all_gather_s = 0.02, .effective_tokens = tokens},
                        .peak_memory_bytes = 40ull << 30, .ranks = tp, .slowest_rank = k % tp,
                        .peak_memory_rank = 0};
      if (absl::Status s = (*state)->RecordTelemetry(*leaders[g], t); !s.ok()) {
        return Fail(s, "telemetry");
      }
    }
  }
  const size_t h2 = HeapInUse();

  for (int g = 0; g < groups; ++g) {
    for (int r = 1; r < tp; ++r) {
      reg.group = g;
      reg.rank_in_group = r;
      reg.global_rank = g * tp + r;
      reg.group_session = false;
      if (auto x = (*state)->Register(reg); !x.ok()) return Fail(x.status(), "register a rank");
    }
  }
  const size_t h3 = HeapInUse();

  const double per_group = static_cast<double>(h1 - h0) / groups;
  const double per_group_step = static_cast<double>(h2 - h1) / (static_cast<double>(groups) * steps);
  const double per_group_after = static_cast<double>(h2 - h0) / groups;
  const double per_rank = static_cast<double>(h3 - h2) / (static_cast<double>(groups) * (tp - 1));
  std::printf("live state of %d groups x %d ranks, heap in use (mallinfo2):\n", groups, tp);
  std::printf("  a registered group (leader's group session, metric series)  %8.0f bytes\n",
              per_group);
  std::printf("  a decided and reported step, per group (first %d steps)      %8.1f bytes\n",
              steps, per_group_step);
  std::printf("  a group after %d steps                                       %8.0f bytes\n",
              steps, per_group_after);
  std::printf("  another rank with a session of its own (per-rank sessions)    %8.0f bytes\n",
              per_rank);
  std::printf("  the decision cache: up to %lld decisions a group of 72 bytes (a DecisionRecord "
              "is %zu)\n",
              static_cast<long long>(options.decision_cache_steps), sizeof(DecisionRecord));
  std::printf("  whole live state: %.1f MiB with group sessions, %.1f MiB with a session per rank\n",
              static_cast<double>(h2 - h0) / (1 << 20), static_cast<double>(h3 - h0) / (1 << 20));
  const std::string out = absl::GetFlag(FLAGS_out);
  if (!out.empty()) {
    std::ofstream f(out);
    f << absl::StrFormat(
        "{\"groups\": %d, \"tp\": %d, \"steps\": %d, \"sequences\": %d,\n"
        " \"bytes_per_group_registered\": %.0f, \"bytes_per_group_step\": %.1f,\n"
        " \"bytes_per_group_after_steps\": %.0f, \"bytes_per_extra_rank_session\": %.0f,\n"
        " \"sizeof_decision_record\": %d, \"state_mib_group_sessions\": %.2f,\n"
        " \"state_mib_rank_sessions\": %.2f, \"bytes_per_group_metric_series\": %.0f,\n"
        " \"decision_cache_steps\": %d}\n",
        groups, tp, steps, sequences, per_group, per_group_step, per_group_after, per_rank,
        static_cast<int>(sizeof(DecisionRecord)), static_cast<double>(h2 - h0) / (1 << 20),
        static_cast<double>(h3 - h0) / (1 << 20), metric_bytes,
        static_cast<int>(options.decision_cache_steps));
  }
  return 0;
}
