// The summary spgate-sim writes (docs/design.md §5 keys: steps, decisions, local_decisions,
// consistency_violations, lost_telemetry, effective_tokens_per_s, step_time_p95_s,
// peak_memory_bytes — plus details, memory_overrides among them). Accumulated per worker
// thread and merged. A group step counts by what its leader's client ran: a daemon answer,
// a local decision, or a memory override (the daemon's TP-only refused, SP run), never two.
// `steps` counts steps (per group); decisions, sources and the per-mode counts count
// group-steps (steps_by_mode, alias group_steps_by_mode); tokens/s is the job's, summed
// over the groups (effective_tokens_per_s, alias job_effective_tokens_per_s).
#ifndef SPGATE_TOOLS_SIM_SUMMARY_H_
#define SPGATE_TOOLS_SIM_SUMMARY_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tools/sim/cost_model.h"
#include "worker/client/gate_client.h"

namespace spgate::sim {

struct ModeTotals {
  int64_t steps = 0;         // group-steps
  double tokens = 0;         // effective tokens
  double time_s = 0;         // simulated step time
  std::vector<double> step_times;
  uint64_t peak_memory = 0;  // max over ranks and steps
  void Add(const GroupStep& s);
  void Merge(const ModeTotals& o);
};

struct Summary {
  std::string command = "run";  // run | replay
  int64_t steps = 0;            // per group
  int groups = 0;
  int tp = 0;
  int threads = 0;
  std::string group_phase;  // run: random | aligned
  // Wall seconds of the work summarised: RunLive's from its start through the final
  // flush, Replay's loop; spgate-sim sets the whole command's (a sweep, a comparison).
  double wall_s = 0;
  std::map<std::string, std::map<std::string, int64_t>> decisions;  // mode -> reason -> n
  // daemon/fallback/local/memory_override
  std::map<std::string, int64_t> sources;
  int64_t local_decisions = 0;
  int64_t memory_overrides = 0;  // group steps: daemon TP-only the memory gate refused
  std::map<std::string, int64_t> local_by_reason;  // by the gate that decided
  int64_t consistency_violations = 0;
  int64_t decide_errors = 0;
  int64_t telemetry_errors = 0;  // refusals: ReportTelemetry (a rank's, the group's), a wait share
  std::string first_error;
  // Sessions at the daemon: one per group (the leader's group session), or one per rank
  // with --group_session=false; 0 without a daemon.
  int64_t sessions = 0;
  // Telemetry records, all clients: produced (one per group step in a group session, one
  // per rank step with --group_session=false), written to the daemon, acknowledged, dropped
  // from full buffers. lost = produced - acknowledged.
  int64_t telemetry_reported = 0, telemetry_sent = 0, telemetry_acked = 0, telemetry_dropped = 0;
  std::vector<double> decision_latency_s;  // leaders: plan submitted -> decision arrived
  std::vector<double> plan_queued_s;       // the part before the client's writer took it
  std::vector<double> from_write_s;        // the rest: writer took it -> decision arrived
  // Leaders: how long each step waited in Decide for its decision (bounded by --deadline
  // whatever the daemon does; the fault campaign holds it to that).
  std::vector<double> decide_wait_s;
  ModeTotals sp, tp_only, all;
  int64_t late_steps = 0;  // ticks the driving thread started late (could not keep up)
  std::string config_json;  // the config in force at the end (replay: the one replayed)
  // More top-level keys, each a JSON value: "sweep", "compare".
  std::map<std::string, std::string> extra_json;

  void AddStep(const GroupStep& step, const client::GateDecision& d);
  void Merge(const Summary& o);
  std::string ToJson() const;
};

double Percentile(std::vector<double> v, double q);
// "1 group", "4 groups": a count and its noun (a plain -s plural) for the human lines.
std::string CountText(int64_t n, const std::string& noun);
std::string GateConfigJson(const GateConfig& c, int64_t version);

}  // namespace spgate::sim

#endif  // SPGATE_TOOLS_SIM_SUMMARY_H_
