// spgate-sim's drivers; see sim.h and docs/sim.md.
#include "tools/sim/sim.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <thread>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/hardware_id.h"
#include "policy/adaptive_policy.h"
#include "policy/gate_config.h"
#include "policy/gate_policy.h"
#include "policy/step_plan.h"
#include "worker/client/gate_client.h"
#include "worker/client/identity.h"
#include "worker/client/group_decider.h"
#include "worker/client/in_memory_broadcast.h"
#include "worker/client/local_policy.h"
#include "worker/client/tls.h"
#include "worker/runtime/lengths.h"

namespace spgate::sim {
namespace {

using client::GateClient;
using client::GateClientOptions;
using client::GateDecision;
using client::GroupDecider;

struct SimGroup {
  int index = 0;
  // The leader's (its group session), or one per rank with --group_session=false.
  std::vector<std::unique_ptr<GateClient>> clients;
  std::unique_ptr<client::InMemoryBroadcast> broadcast;
  std::vector<std::unique_ptr<GroupDecider>> deciders;
  std::unique_ptr<runtime::BatchBuilder> batches;
  std::mt19937_64 rng;
  std::optional<Mode> last_mode;       // of the last step that ran (--switch_cost_s)
  std::vector<int64_t> current, next;  // batches for step k and k + 1
  // The step that ran and has not been reported yet: a step lasts until the next tick,
  // where its telemetry goes out just before the next plan (as a trainer's would).
  struct Ran {
    int64_t step = -1;  // -1: none
    GroupStep result;
    std::vector<GateDecision> seen;  // each rank's copy of the decision
  } ran;
};

uint64_t Mix(uint64_t seed, uint64_t a, uint64_t b = 0) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (a + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^
               (b + 1) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

absl::Status SubmitNext(SimGroup& g, const CostModel& model, int64_t step) {
  const MemoryPrediction mem = model.PredictMemory(g.next);
  return g.deciders[0]->SubmitPlan({.step = step,
                                    .lengths = g.next,
                                    .predicted_peak_bytes_sp = mem.sp,
                                    .predicted_peak_bytes_tp = mem.tp,
                                    .memory_budget_bytes = mem.budget});
}

// One group's step k: every rank decides (the leader first: its broadcast is the send,
// the others' are receives) and the cost model runs the mode; ReportStep reports it when
// the step is over.
void StepGroup(SimGroup& g, const CostModel& model, int64_t k, absl::Time deadline,
               Summary& sum) {
  const int t = static_cast<int>(g.deciders.size());
  std::vector<GateDecision> seen(t);
  for (int r = 0; r < t; ++r) {
    const absl::Time asked = absl::Now();
    absl::StatusOr<GateDecision> d = g.deciders[r]->Decide(k, deadline);
    if (r == 0) sum.decide_wait_s.push_back(absl::ToDoubleSeconds(absl::Now() - asked));
    if (!d.ok()) {
      ++sum.decide_errors;
      if (sum.first_error.empty()) {
        sum.first_error = absl::StrFormat("group %d rank %d step %d: %s", g.index, r, k,
                                          d.status().ToString());
      }
      return;
    }
    seen[r] = *d;
  }
  bool consistent = true;
  for (int r = 1; r < t; ++r) consistent = consistent && seen[r].mode == seen[0].mode;
  if (!consistent) ++sum.consistency_violations;
  g.ran.step = k;
  g.ran.result = model.Step(g.current, seen[0].mode, g.rng, k);
  g.ran.result.step_time_s += model.SwitchSeconds(g.last_mode, seen[0].mode);
  g.last_mode = seen[0].mode;
  g.ran.seen = std::move(seen);
  sum.AddStep(g.ran.result, g.ran.seen[0]);
}

// The step that ran: each rank reports the mode it ran (its own copy of the decision),
// the leader last: in a group session the others' records are reduced into its (a
// contributor never waits).
void ReportStep(SimGroup& g, const SimOptions& o, Summary& sum) {
  if (g.ran.step < 0) return;
  const int64_t k = g.ran.step;
  const GroupStep& step = g.ran.result;
  g.ran.step = -1;
  // A refused record counts in telemetry_errors; the first one is named.
  auto refused = [&](const absl::Status& s, int rank, const char* what) {
    if (s.ok()) return;
    ++sum.telemetry_errors;
    if (sum.first_error.empty()) {
      sum.first_error =
          absl::StrFormat("group %d rank %d step %d %s: %s", g.index, rank, k, what, s.ToString());
    }
  };
  for (int r = static_cast<int>(g.deciders.size()) - 1; r >= 0; --r) {
    const absl::Status s = g.deciders[r]->ReportTelemetry(
        {.step = k,
         .mode = g.ran.seen[r].mode,
         .reason = g.ran.seen[r].reason,
         .step_time_s = step.step_time_s,
         .rs_wait_s = step.ranks[r].rs_wait_s,
         .all_gather_s = step.ranks[r].all_gather_s,
         .norm_stall_s = step.ranks[r].norm_stall_s,
         .effective_tokens = step.effective_tokens,
         .padding_tokens = step.padding_tokens,
         .peak_memory_bytes = step.peak_memory_bytes,
         .all_reduce_s = step.ranks[r].all_reduce_s});
    refused(s, r, "telemetry");
  }
  // A group session's leader has the group's share from the reduction already.
  if (!o.group_session && o.leader_group_rs_wait) {
    refused(g.clients[0]->ObserveGroupRsWaitShare(k, g.ran.seen[0].mode,
                                                   step.group_rs_wait_share),
            0, "wait share");
  }
}

int ThreadCount(const SimOptions& o) {
  if (o.threads > 0) return std::min(o.threads, o.groups);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, std::min({o.groups, 2 * cores, 16}));
}

absl::Status PipelineOnlyInCompare() {
  return absl::InvalidArgumentError(
      "--pp/--vp/--microbatches: pipelines are simulated by `spgate-sim replay --compare` only");
}

absl::Status Validate(const SimOptions& o) {
  if (!o.controller.empty() && o.job_id.empty()) {
    return absl::InvalidArgumentError(
        "--job_id: required with --controller (or set SPGATE_JOB_ID); the daemon keys "
        "decisions by job");
  }
  if (absl::Status s = ValidateRunShape(o); !s.ok()) return s;
  if (!(o.steps_per_s > 0)) return absl::InvalidArgumentError("--steps_per_s must be > 0");
  if (o.deadline < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--deadline must be >= 0, got ", absl::FormatDuration(o.deadline)));
  }
  if (o.flush_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--flush_timeout must be >= 0");
  }
  if (o.steps == 0 && o.duration <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("set --steps or a positive --duration");
  }
  if (!o.leader_group_rs_wait && o.group_session) {
    return absl::InvalidArgumentError(
        "--leader_group_rs_wait=false needs --group_session=false: a group session's leader "
        "learns the group's wait share from the group's reduced telemetry");
  }
  if (absl::Status s = ValidateGateConfig(o.initial_config); !s.ok()) return s;
  if (absl::Status s = ValidateCostParams(o.cost); !s.ok()) return s;
  if (o.pipelined()) return PipelineOnlyInCompare();
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateRunShape(const SimOptions& o) {
  auto bad = [](const char* flag, const char* bound, int64_t v) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " must be ", bound, ", got ", v));
  };
  if (o.groups < 1) return bad("groups", ">= 1", o.groups);
  if (o.cost.tp < 1 || o.cost.tp > 1024) return bad("tp", "in [1, 1024]", o.cost.tp);
  if (o.tokens_per_batch < 1) return bad("tokens_per_batch", ">= 1", o.tokens_per_batch);
  if (o.steps < 0) return bad("steps", ">= 0", o.steps);
  if (o.threads < 0) return bad("threads", ">= 0 (0: min(groups, 2 x cores, 16))", o.threads);
  return absl::OkStatus();
}

uint64_t GroupLengthSeed(uint64_t seed, int group) {
  return seed * 1000003 + static_cast<uint64_t>(group);
}

absl::StatusOr<std::unique_ptr<runtime::BatchBuilder>> GroupBatches(const SimOptions& o,
                                                                    int group) {
  // Lengths are clamped to the budget, so a longer sequence is cut to one full batch.
  absl::StatusOr<std::unique_ptr<runtime::LengthSource>> source =
      runtime::ParseLengthSource(o.lengths, GroupLengthSeed(o.seed, group), o.tokens_per_batch);
  if (!source.ok()) return source.status();
  // A trace has no seed: each group starts at its own share of it so groups differ.
  const int64_t cycle = (*source)->cycle_length();
  for (int64_t i = 0, skip = cycle * group / std::max(1, o.groups); i < skip; ++i) {
    (*source)->Next();
  }
  return std::make_unique<runtime::BatchBuilder>(
      *std::move(source),
      runtime::BatchBuilderOptions{.tokens_per_batch = o.tokens_per_batch,
                                   .bucketing = o.bucketing});
}

absl::StatusOr<SimOptions::GroupPhase> ParseGroupPhase(const std::string& value) {
  if (value == "random") return SimOptions::GroupPhase::kRandom;
  if (value == "aligned") return SimOptions::GroupPhase::kAligned;
  return absl::InvalidArgumentError(
      absl::StrCat("--group_phase=", value, ": want random or aligned"));
}

absl::StatusOr<PipelineSchedule> ParseSchedule(const std::string& value) {
  if (value == "1f1b") return PipelineSchedule::k1F1B;
  // The output names it by the policy's ScheduleName, which reads back too.
  if (value == "interleaved" || value == ScheduleName(PipelineSchedule::kInterleaved1F1B)) {
    return PipelineSchedule::kInterleaved1F1B;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--schedule=", value, ": want 1f1b or interleaved (interleaved_1f1b, the name the "
      "output uses)"));
}

const char* GroupPhaseName(SimOptions::GroupPhase phase) {
  return phase == SimOptions::GroupPhase::kAligned ? "aligned" : "random";
}

std::vector<absl::Duration> GroupPhases(const SimOptions& o) {
  std::vector<absl::Duration> phase(static_cast<size_t>(std::max(0, o.groups)));
  if (o.group_phase == SimOptions::GroupPhase::kAligned || !(o.steps_per_s > 0)) return phase;
  const absl::Duration period = absl::Seconds(1.0 / o.steps_per_s);
  for (size_t gi = 0; gi < phase.size(); ++gi) {
    const double u = static_cast<double>(Mix(o.seed, gi, 2) >> 11) * 0x1.0p-53;  // [0, 1)
    phase[gi] = period * u;
  }
  return phase;
}

int64_t StepsFor(const SimOptions& o) {
  if (o.steps > 0) return o.steps;
  return std::max<int64_t>(1, static_cast<int64_t>(absl::ToDoubleSeconds(o.duration) * o.steps_per_s));
}

namespace {

// ---- RunLive's steps ----

// What every simulated rank's client shares: the launch's incarnation and credential, the
// TLS credentials and the worker token.
struct LiveIdentity {
  std::string incarnation;
  std::string launch_credential;
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::string worker_token;
  std::string hardware_id;  // SPGATE_HARDWARE_ID, else SimulatedHardwareId
};

// The options checked and the shared files read once (refused naming --tls_* and
// --worker_token_file) before any group dials.
absl::StatusOr<LiveIdentity> PrepareLive(const SimOptions& o) {
  LiveIdentity id;
  // One launch of the simulated job: the same for every simulated rank.
  id.incarnation = o.incarnation;
  if (id.incarnation.empty()) id.incarnation = client::IncarnationFromEnvironment();
  if (id.incarnation.empty()) id.incarnation = client::NewIncarnation();
  if (absl::Status s = Validate(o); !s.ok()) return s;
  // Its secret: the simulator is the whole launch, so it is world rank 0 and makes it.
  if (!o.controller.empty()) {
    id.launch_credential = o.launch_credential;
    const char* source = "launch_credential";
    if (id.launch_credential.empty()) {
      id.launch_credential = client::LaunchCredentialFromEnvironment();
      source = "SPGATE_LAUNCH_CREDENTIAL";
    }
    if (id.launch_credential.empty()) {
      absl::StatusOr<std::string> made = client::NewLaunchCredential();
      if (!made.ok()) return made.status();
      id.launch_credential = *std::move(made);
    }
    if (absl::Status s = CheckLaunchCredential(id.launch_credential, source);
        !s.ok()) {
      return s;
    }
    // The simulated hardware, not the host's CPU (the client library's default): it keys
    // the learned tables. SPGATE_HARDWARE_ID wins, as it does for spgate-worker.
    id.hardware_id = client::DefaultHardwareId(SimulatedHardwareId(o.cost));
    if (absl::Status s = ValidateHardwareId(id.hardware_id, "SPGATE_HARDWARE_ID"); !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      client::TlsChannelCredentials(o.tls, client::kTlsFlagNames);
  if (!credentials.ok()) return credentials.status();
  id.credentials = *std::move(credentials);
  absl::StatusOr<std::string> worker_token = client::ReadWorkerTokenFile(o.worker_token_file);
  if (!worker_token.ok()) return worker_token.status();
  id.worker_token = *std::move(worker_token);
  return id;
}

// The options every rank of group `gi` shares.
GateClientOptions GroupClientOptions(const SimOptions& o, const CostModel& model,
                                     const LiveIdentity& id, int gi) {
  GateClientOptions base;
  base.controller = o.controller;
  base.credentials = id.credentials;
  base.tls_server_name = o.tls.server_name;
  base.worker_token = id.worker_token;
  base.job_id = o.job_id;
  base.incarnation = id.incarnation;
  base.launch_credential = id.launch_credential;
  base.hardware_id = id.hardware_id;
  base.group = gi;
  base.group_size = o.cost.tp;
  base.model = {o.cost.layers, o.cost.hidden, o.cost.heads, 4 * o.cost.hidden};
  base.memory_budget_bytes = model.PredictMemory(std::vector<int64_t>{1}).budget;
  base.initial_config = o.initial_config;
  base.decision_deadline = o.deadline;
  base.telemetry_flush_interval = o.telemetry_flush;
  base.host = absl::StrCat("sim-", gi);
  return base;
}

// Group `gi`: its batches, its broadcast, per rank a GroupDecider, and the leader's client
// (every rank's with --group_session=false); one connection for the group, like one per
// training pod.
absl::StatusOr<std::unique_ptr<SimGroup>> MakeGroup(const SimOptions& o, const CostModel& model,
                                                    const LiveIdentity& id, int gi) {
  const int t = o.cost.tp;
  auto g = std::make_unique<SimGroup>();
  g->index = gi;
  g->rng.seed(Mix(o.seed, gi, 1));
  absl::StatusOr<std::unique_ptr<runtime::BatchBuilder>> batches = GroupBatches(o, gi);
  if (!batches.ok()) return batches.status();
  g->batches = *std::move(batches);
  g->broadcast = std::make_unique<client::InMemoryBroadcast>(t, absl::Seconds(60));
  const GateClientOptions base = GroupClientOptions(o, model, id, gi);
  std::shared_ptr<grpc::Channel> channel;
  if (!o.controller.empty()) channel = client::CreateGateChannel(base, /*own_connection=*/true);
  for (int r = 0; r < t; ++r) {
    GateClient* own = nullptr;
    if (r == 0 || !o.group_session) {
      GateClientOptions co = base;
      co.rank_in_group = r;
      co.global_rank = gi * t + r;
      co.seed = Mix(o.seed, gi, 100 + r);
      co.channel = channel;
      co.group_session = o.group_session;
      absl::StatusOr<std::unique_ptr<GateClient>> c = GateClient::Create(co);
      if (!c.ok()) return c.status();
      g->clients.push_back(std::move(*c));
      own = g->clients.back().get();
    }
    absl::StatusOr<std::unique_ptr<GroupDecider>> d = GroupDecider::Create(
        own, r, g->broadcast->ForRank(r),
        o.group_session ? g->broadcast->ReduceForRank(r) : client::MaxReduceFn{});
    if (!d.ok()) return d.status();
    g->deciders.push_back(std::move(*d));
  }
  return g;
}

// With a daemon: every client's stream, within --connect_timeout in all. Not fatal: the run
// is fail-static by design, and the summary shows the local decisions.
void WaitForDaemon(const SimOptions& o, const std::vector<std::unique_ptr<SimGroup>>& groups) {
  if (o.controller.empty()) return;
  const absl::Time give_up = absl::Now() + o.connect_timeout;
  absl::Status connected = [&]() -> absl::Status {
    for (const auto& g : groups) {
      for (const auto& c : g->clients) {
        if (absl::Status s = c->WaitUntilConnected(give_up - absl::Now()); !s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }();
  if (!connected.ok()) {
    std::fprintf(stderr,
                 "spgate-sim: not every stream connected within --connect_timeout=%s; "
                 "continuing, a leader without a stream decides locally: %s\n",
                 absl::FormatDuration(o.connect_timeout).c_str(), connected.ToString().c_str());
  }
}

// The groups of one driver thread that tick at the same offset in the period.
struct Slot {
  absl::Duration offset;
  std::vector<SimGroup*> groups;
};

// Driver thread w of W owns groups w, w + W, ...; its slots in time order.
std::vector<Slot> SlotsOf(int w, int W, const std::vector<absl::Duration>& phase,
                          const std::vector<std::unique_ptr<SimGroup>>& groups) {
  std::vector<Slot> slots;
  for (int gi = w; gi < static_cast<int>(groups.size()); gi += W) {
    auto it = std::find_if(slots.begin(), slots.end(),
                           [&](const Slot& s) { return s.offset == phase[gi]; });
    if (it == slots.end()) it = slots.insert(slots.end(), Slot{phase[gi], {}});
    it->groups.push_back(groups[gi].get());
  }
  std::sort(slots.begin(), slots.end(),
            [](const Slot& a, const Slot& b) { return a.offset < b.offset; });
  return slots;
}

// The leader buckets for the target CV of the config that will be in force, as
// spgate-worker does.
std::vector<int64_t> NextBatch(SimGroup& g, int64_t step) {
  const double target = g.clients[0]->ConfigFor(step).config.bucket_target_cv;
  return g.batches->Next(target).lengths;
}

// When the driver threads tick: tick k of a slot is at start + offset + k periods.
struct LiveClock {
  absl::Time start;
  absl::Duration period;
};

// Tick k of one slot: wait for its instant (more than half a period late counts as a late
// step); for each group report step k - 1, which has just ended, and send the plan for
// k + 1 before step k is decided and run (docs/design.md §4; the record and the plan leave
// in one message, as a trainer's do); then run step k. Tick -1 only plans; tick `steps`
// only reports.
void RunTick(const SimOptions& o, const CostModel& model, const LiveClock& clock,
             const Slot& slot, int64_t k, int64_t steps, Summary& sum,
             ProgressReporter* progress) {
  const absl::Time tick = clock.start + slot.offset + clock.period * static_cast<double>(k);
  const absl::Time now = absl::Now();
  if (now < tick) {
    absl::SleepFor(tick - now);
  } else if (k >= 0 && now - tick > clock.period / 2) {
    ++sum.late_steps;
  }
  const absl::Time deadline = std::max(absl::Now(), tick) + o.deadline;
  const bool last = k == steps;
  for (SimGroup* g : slot.groups) {
    ReportStep(*g, o, sum);
    if (last) continue;
    g->current = std::move(g->next);
    g->next = NextBatch(*g, k + 1);
    if (absl::Status s = SubmitNext(*g, model, k + 1); !s.ok()) {
      ++sum.decide_errors;
      if (sum.first_error.empty()) sum.first_error = s.ToString();
    }
  }
  if (k < 0 || last) return;
  for (SimGroup* g : slot.groups) {
    StepGroup(*g, model, k, deadline, sum);
    if (progress == nullptr || g->ran.step != k) continue;  // not run: a decision error
    const bool sp = g->ran.seen[0].mode == Mode::kSequenceParallel;
    progress->Add({.parts = 1, .tokens = static_cast<double>(g->ran.result.effective_tokens),
                   .sp = sp ? 1 : 0, .tp = sp ? 0 : 1});
  }
}

// W driver threads over the groups, each serving its slots' ticks in time order, the groups
// that share an instant together (all records and plans first, then the steps); one
// Summary per thread. Tick -1, a period before the first step, plans step 0 (a trainer
// plans before it starts); tick `steps` reports the last step.
std::vector<Summary> DriveGroups(const SimOptions& o, const CostModel& model,
                                 const std::vector<std::unique_ptr<SimGroup>>& groups, int W,
                                 int64_t steps, const LiveClock& clock,
                                 ProgressReporter* progress) {
  std::vector<Summary> partial(W);
  const std::vector<absl::Duration> phase = GroupPhases(o);
  std::vector<std::thread> threads;
  for (int w = 0; w < W; ++w) {
    threads.emplace_back([&, w] {
      const std::vector<Slot> slots = SlotsOf(w, W, phase, groups);
      for (int64_t k = -1; k <= steps; ++k) {
        for (const Slot& slot : slots) {
          RunTick(o, model, clock, slot, k, steps, partial[w], progress);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  return partial;
}

// After the run: every client that the daemon registered flushes its telemetry (they
// drain concurrently; the waits overlap; one the daemon never answered is not waited
// for), then the leaders' decision latencies and every client's counters join `total`.
void CollectClients(const SimOptions& o, const std::vector<std::unique_ptr<SimGroup>>& groups,
                    Summary& total) {
  if (!o.controller.empty()) {
    const absl::Time give_up = absl::Now() + o.flush_timeout;
    std::vector<GateClient*> later;  // not registered yet: looked at again after the rest
    int clients = 0;
    for (const auto& g : groups) {
      for (const auto& c : g->clients) {
        ++clients;
        if (c->stats().registrations == 0) {
          later.push_back(c.get());
          continue;
        }
        (void)c->Flush(std::max(absl::ZeroDuration(), give_up - absl::Now()));
      }
    }
    int never_registered = 0;
    for (GateClient* c : later) {
      if (c->stats().registrations == 0) {
        ++never_registered;
        continue;
      }
      (void)c->Flush(std::max(absl::ZeroDuration(), give_up - absl::Now()));
    }
    if (never_registered > 0) {
      std::fprintf(stderr,
                   "spgate-sim: %d of %d clients never registered with %s during the run; "
                   "their telemetry was not flushed\n",
                   never_registered, clients, o.controller.c_str());
    }
  }
  for (const auto& g : groups) {
    for (const GateClient::DecisionLatency& l : g->clients[0]->TakeDecisionLatencies()) {
      total.decision_latency_s.push_back(l.total_s);
      total.plan_queued_s.push_back(l.queued_s);
      total.from_write_s.push_back(l.total_s - l.queued_s);
    }
    for (const auto& c : g->clients) {  // the sessions the daemon gave: registered clients
      total.sessions += !o.controller.empty() && c->stats().registrations > 0;
    }
    for (const auto& c : g->clients) {
      const client::GateClientStats st = c->stats();
      total.telemetry_reported += st.telemetry_reported;
      total.telemetry_sent += o.controller.empty() ? st.telemetry_reported : st.telemetry_sent;
      total.telemetry_acked += o.controller.empty() ? st.telemetry_reported : st.telemetry_acked;
      total.telemetry_dropped += st.telemetry_dropped;
    }
  }
}

}  // namespace

std::unique_ptr<ProgressReporter> MakeProgress(const SimOptions& o, std::string label,
                                               int64_t total_steps, int64_t parts_per_step,
                                               int64_t check_every) {
  if (!o.progress) return nullptr;
  ProgressReporter::Options po;
  po.label = std::move(label);
  po.total_steps = total_steps;
  po.parts_per_step = std::max<int64_t>(1, parts_per_step);
  po.check_every = check_every;
  po.rate_unit = "tok/s/job";  // every simulated group's tokens, summed
  return std::make_unique<ProgressReporter>(std::move(po));
}

absl::StatusOr<Summary> RunLive(const SimOptions& o) {
  const absl::Time started = absl::Now();
  absl::StatusOr<LiveIdentity> id = PrepareLive(o);
  if (!id.ok()) return id.status();
  const CostModel model(o.cost);
  const int64_t steps = StepsFor(o);
  std::vector<std::unique_ptr<SimGroup>> groups;
  for (int gi = 0; gi < o.groups; ++gi) {
    absl::StatusOr<std::unique_ptr<SimGroup>> g = MakeGroup(o, model, *id, gi);
    if (!g.ok()) return g.status();
    groups.push_back(*std::move(g));
  }
  WaitForDaemon(o, groups);

  const int W = ThreadCount(o);
  const absl::Duration period = absl::Seconds(1.0 / o.steps_per_s);
  const LiveClock clock{.start = absl::Now() + absl::Milliseconds(50) + period,
                        .period = period};
  const std::unique_ptr<ProgressReporter> progress = MakeProgress(o, "spgate-sim", steps, o.groups);
  const std::vector<Summary> partial =
      DriveGroups(o, model, groups, W, steps, clock, progress.get());
  if (progress) progress->Finish();

  Summary total;
  for (const Summary& p : partial) total.Merge(p);
  CollectClients(o, groups, total);
  const client::ScheduledConfig cfg = groups[0]->clients[0]->ConfigFor(steps);
  total.config_json = GateConfigJson(cfg.config, cfg.version);
  total.command = "run";
  total.steps = steps;
  total.groups = o.groups;
  total.tp = o.cost.tp;
  total.threads = W;
  total.group_phase = GroupPhaseName(o.group_phase);
  // The whole run: connecting (a refused stream waits --connect_timeout), the steps and
  // the final flush, as a reader timing the command would count it.
  total.wall_s = absl::ToDoubleSeconds(absl::Now() - started);
  return total;
}

void ShowDueSamples(const GateConfig& config, ThroughputTable& table,
                    std::deque<GroupStepSample>& pending, int64_t k, bool prior) {
  while (!pending.empty() && pending.front().step + kReplayLearnLagSteps <= k) {
    ObserveGroupStep(config, table, pending.front(), prior);
    pending.pop_front();
  }
}

uint64_t GroupNoiseSeed(uint64_t seed, int group) { return Mix(seed, group, 1); }

absl::StatusOr<int64_t> ReplaySteps(const SimOptions& o, const GateConfig& config) {
  absl::StatusOr<std::unique_ptr<runtime::LengthSource>> probe =
      runtime::ParseLengthSource(o.lengths, o.seed, o.tokens_per_batch);
  if (!probe.ok()) return probe.status();
  // A trace with no --steps is replayed once through; a distribution for 1,000 steps.
  int64_t steps = o.steps;
  if (steps == 0) {
    const int64_t trace = (*probe)->cycle_length();
    if (trace > 0) {
      runtime::BatchBuilder batches(*std::move(probe), {.tokens_per_batch = o.tokens_per_batch,
                                                        .bucketing = o.bucketing});
      int64_t seen = 0;
      while (seen < trace) {
        seen += static_cast<int64_t>(batches.Next(config.bucket_target_cv).lengths.size());
        ++steps;
      }
    } else {
      steps = 1000;
    }
  }
  return steps;
}

PriorInputs DeclaredPriorInputs(const SimOptions& o) {
  if (!o.adaptive_prior) return {};
  return PriorInputs{.tp = o.cost.tp, .hidden = o.cost.hidden, .layers = o.cost.layers};
}

std::string SimulatedHardwareId(const CostParams& c) {
  std::string id = absl::StrCat("sim:", c.hardware);
  absl::StatusOr<const HardwarePreset*> preset = FindHardwarePreset(c.hardware);
  if (preset.ok()) {
    const HardwarePreset& p = **preset;
    const std::tuple<const char*, double, double> constants[] = {
        {"device_tflops", c.device_tflops, p.device_tflops},
        {"mfu", c.mfu, p.gemm_mfu},
        {"attention_tflops", c.attention_tflops, p.attention_tflops},
        {"hbm_gbps", c.hbm_gbps, p.hbm_gbps},
        {"device_memory_gib", c.device_memory_gib, p.device_memory_gib},
        {"collective_latency_us", c.collective_latency_us, p.collective_latency_us}};
    for (const auto& [flag, value, preset_value] : constants) {
      if (value != preset_value) absl::StrAppend(&id, " ", flag, "=", ShortestText(value));
    }
    if (c.nvls != p.nvls) absl::StrAppend(&id, " nvls=", c.nvls ? "true" : "false");
  }
  // A flat link is another network model than the preset's curves, whatever its speed.
  if (c.flat_link) absl::StrAppend(&id, " link_gbps=", ShortestText(c.link_gbps));
  if (id.size() <= kMaxHardwareIdLength) return id;
  // Cut after a whole constant, the whole kept apart by its hash (FNV-1a: the same in
  // every build, so a relaunch with the same flags finds its table).
  uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char ch : id) hash = (hash ^ ch) * 0x100000001b3ull;
  const std::string tail = absl::StrFormat(" #%016x", hash);
  std::string head = id.substr(0, kMaxHardwareIdLength - tail.size() + 1);
  if (const size_t space = head.rfind(' '); space != std::string::npos) head.resize(space);
  return head.substr(0, kMaxHardwareIdLength - tail.size()) + tail;
}

absl::StatusOr<Summary> Replay(const SimOptions& o, const GateConfig& config) {
  if (absl::Status s = ValidateGateConfig(config); !s.ok()) return s;
  if (absl::Status s = ValidateCostParams(o.cost); !s.ok()) return s;
  if (o.pipelined()) return PipelineOnlyInCompare();
  absl::StatusOr<int64_t> replay_steps = ReplaySteps(o, config);
  if (!replay_steps.ok()) return replay_steps.status();
  const int64_t steps = *replay_steps;
  const CostModel model(o.cost);
  const absl::Time start = absl::Now();
  Summary sum;
  std::vector<std::unique_ptr<runtime::BatchBuilder>> batches;
  std::vector<std::mt19937_64> rngs;
  std::vector<client::LocalGatePolicy> policies;
  std::vector<std::optional<Mode>> last_mode(static_cast<size_t>(o.groups));
  std::vector<char> last_probe(static_cast<size_t>(o.groups), 0);
  for (int gi = 0; gi < o.groups; ++gi) {
    absl::StatusOr<std::unique_ptr<runtime::BatchBuilder>> b = GroupBatches(o, gi);
    if (!b.ok()) return b.status();
    batches.push_back(*std::move(b));
    rngs.emplace_back(GroupNoiseSeed(o.seed, gi));
    policies.emplace_back(config, 0);
  }
  // ADAPTIVE learns as the daemon would: one table pooled over the groups, a step's
  // sample visible kReplayLearnLagSteps later. Step-major, so no group sees another's
  // future.
  const bool adaptive = config.policy == GatePolicyKind::kAdaptive;
  ThroughputTable learned;
  learned.SetPriorInputs(DeclaredPriorInputs(o));
  learned.MarkCollectivesTimed();  // every rank's collectives are timed here
  std::deque<GroupStepSample> pending;
  const std::unique_ptr<ProgressReporter> progress =
      MakeProgress(o, "spgate-sim replay", steps, o.groups, /*check_every=*/64);
  for (int64_t k = 0; k < steps; ++k) {
    ShowDueSamples(config, learned, pending, k, o.adaptive_prior);
    for (int gi = 0; gi < o.groups; ++gi) {
      client::LocalGatePolicy& policy = policies[gi];
      if (adaptive) policy.SetLearnedTable(learned);
      const std::vector<int64_t> lengths = batches[gi]->Next(config.bucket_target_cv).lengths;
      absl::StatusOr<LengthStats> stats = ComputeLengthStats(lengths);
      if (!stats.ok()) return stats.status();
      const MemoryPrediction mem = model.PredictMemory(lengths);
      const client::LocalDecision ld = policy.Decide({.step = k,
                                                      .length_cv = stats->cv,
                                                      .tokens = stats->tokens,
                                                      .predicted_peak_bytes_sp = mem.sp,
                                                      .predicted_peak_bytes_tp = mem.tp,
                                                      .memory_budget_bytes = mem.budget});
      GroupStep step = model.Step(lengths, ld.decision.mode, rngs[gi], k);
      const bool switched = last_mode[gi].has_value() && *last_mode[gi] != ld.decision.mode;
      step.step_time_s += model.SwitchSeconds(last_mode[gi], ld.decision.mode);
      last_mode[gi] = ld.decision.mode;
      const bool probe = ld.decision.reason == Reason::kProbe;
      policy.ObserveRsWaitShare(k, ld.decision.mode, step.group_rs_wait_share);
      if (adaptive) {
        pending.push_back({.band = BandOf(config, stats->cv, stats->tokens),
                           .mode = ld.decision.mode, .step = k,
                           .tokens = static_cast<double>(step.effective_tokens),
                           .seconds = step.step_time_s, .length_cv = stats->cv,
                           .all_gather_s = step.group_all_gather_s(),
                           .rs_wait_s = step.group_rs_wait_s(), .probe = probe,
                           .after_switch = switched,
                           .exploration = ExplorationSwitch(switched, probe, last_probe[gi]),
                           .forced = IsForcedReason(ld.decision.reason),
                           .straggler_s = step.straggler_s(), .timed = true});
      }
      last_probe[gi] = probe;
      GateDecision d;
      d.step = k;
      d.mode = ld.decision.mode;
      d.reason = d.policy_reason = ld.decision.reason;
      d.source = client::DecisionSource::kLocalOnly;
      sum.AddStep(step, d);
      if (progress) {
        const bool sp = d.mode == Mode::kSequenceParallel;
        progress->Add({.parts = 1, .tokens = static_cast<double>(step.effective_tokens),
                       .sp = sp ? 1 : 0, .tp = sp ? 0 : 1, .sim_seconds = step.step_time_s});
      }
    }
  }
  if (progress) progress->Finish();
  sum.command = "replay";
  sum.steps = steps;
  sum.groups = o.groups;
  sum.tp = o.cost.tp;
  sum.threads = 1;
  sum.config_json = GateConfigJson(config, 0);
  sum.wall_s = absl::ToDoubleSeconds(absl::Now() - start);
  return sum;
}

}  // namespace spgate::sim
