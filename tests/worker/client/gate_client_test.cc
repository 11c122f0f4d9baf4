// GateClient + GroupDecider against the real daemon (Daemon::Start on 127.0.0.1:0):
// decisions arrive before the deadline on a healthy stream; with the daemon stopped
// every decision is the local policy's and identical on all ranks; after a restart the
// client reconnects in bounded time and its local decisions appear in the daemon's
// metrics; a config update applies exactly at its effective_from_step on every rank; and
// thousands of steps over several groups with random delays and a restart in the middle
// give zero disagreements; a second process taking a rank's seat with the launch's
// credential ends the first one's session for good (no tug of war), and a wrong
// credential is refused. Ranks are threads, the broadcast is in memory.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/daemon.h"
#include "spgate/v1/admin.grpc.pb.h"
#include "tests/testing/policy_printers.h"
#include "tests/testing/metrics_scrape.h"
#include "tests/testing/status_matchers.h"
#include "worker/client/gate_client.h"
#include "worker/client/group_decider.h"
#include "worker/client/in_memory_broadcast.h"

namespace spgate::client {
namespace {

using ::spgate::testing::IsOk;

const std::vector<int64_t> kEven = {4096, 4096, 4000, 4100};   // CV ~0.01: SP
const std::vector<int64_t> kMixed = {512, 8192, 1024, 4096};   // CV ~0.8: TP-only
const std::vector<int64_t> kMid = {3000, 5000, 3000, 5000};    // CV 0.25



// One TP group: a GateClient per rank (telemetry on every rank, decisions on rank 0) or
// only the leader's (its group session speaks for the group, Init's group_session),
// a GroupDecider per rank over one in-memory broadcast. Run() drives all ranks as threads
// through a range of steps; the leader submits the plan for step n + 1 before deciding n.
struct Group {
  std::string job;
  int index = 0;
  int size = 0;
  std::vector<std::unique_ptr<GateClient>> clients;
  std::unique_ptr<InMemoryBroadcast> broadcast;
  std::vector<std::unique_ptr<GroupDecider>> deciders;
  std::vector<std::vector<GateDecision>> seen;  // per rank, in step order
  int64_t next_plan = 0;
  // Optional: random delays around the broadcast and the step.
  std::function<void(int rank, std::mt19937&)> jitter;

  // `deadline`: the leader's decision deadline. Tests that assert every decision is the
  // daemon's use more than the 20 ms default, so a loaded CI machine cannot make them
  // flaky; what they check (pipelined answers are there in time) does not depend on it.
  // `group_session`: the leader's session speaks for the group (the clients' default: one
  // client, the group's telemetry reduced in the group); false: a client and a session per
  // rank, each reporting its own records (what most tests here exercise: every rank's
  // buffering across reconnects).
  void Init(const std::string& controller, const std::string& job_id, int group, int ranks,
            absl::Duration deadline = absl::Milliseconds(20), bool group_session = false) {
    job = job_id;
    index = group;
    size = ranks;
    broadcast = std::make_unique<InMemoryBroadcast>(ranks, absl::Seconds(60));
    seen.assign(ranks, {});
    for (int r = 0; r < ranks; ++r) {
      if (group_session && r > 0) {
        auto d = GroupDecider::Create(nullptr, r, broadcast->ForRank(r), broadcast->ReduceForRank(r));
        ASSERT_THAT(d.status(), IsOk());
        deciders.push_back(std::move(*d));
        continue;
      }
      GateClientOptions o;
      o.controller = controller;
      o.job_id = job_id;
      o.incarnation = "test-launch";
      o.launch_credential = "0123456789abcdef0123456789abcdef";  // a fixed test credential
      o.group = group;
      o.rank_in_group = r;
      o.group_size = ranks;
      o.global_rank = group * ranks + r;
      o.initial_backoff = absl::Milliseconds(50);
      o.max_backoff = absl::Milliseconds(500);
      o.seed = static_cast<uint64_t>(o.global_rank + 1);
      o.decision_deadline = deadline;
      o.group_session = group_session;
      auto c = GateClient::Create(o);
      ASSERT_THAT(c.status(), IsOk());
      clients.push_back(std::move(*c));
      auto d = GroupDecider::Create(clients.back().get(), r, broadcast->ForRank(r),
                                    group_session ? broadcast->ReduceForRank(r) : MaxReduceFn{});
      ASSERT_THAT(d.status(), IsOk());
      deciders.push_back(std::move(*d));
    }
  }

  absl::Status WaitConnected() {
    for (auto& c : clients) {
      if (absl::Status s = c->WaitUntilConnected(absl::Seconds(20)); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // Runs steps [from, to). `lengths(step)` is the batch; `step_time` the simulated work;
  // `on_leader_step(step)` runs on the leader before it decides `step`.
  void Run(int64_t from, int64_t to, const std::function<const std::vector<int64_t>&(int64_t)>& lengths,
           absl::Duration step_time = absl::ZeroDuration(),
           const std::function<void(int64_t)>& on_leader_step = nullptr) {
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
        std::mt19937 rng(static_cast<uint32_t>(index * 1000 + r));
        GroupDecider& d = *deciders[r];
        for (int64_t step = from; step < to; ++step) {
          if (d.is_leader()) {
            if (next_plan <= step) {
              ASSERT_THAT(d.SubmitPlan({.step = step, .lengths = lengths(step)}), IsOk());
              next_plan = step + 1;
            }
            ASSERT_THAT(d.SubmitPlan({.step = step + 1, .lengths = lengths(step + 1)}), IsOk());
            next_plan = step + 2;
            if (on_leader_step) on_leader_step(step);
          }
          if (jitter) jitter(r, rng);
          absl::StatusOr<GateDecision> got = d.Decide(step);
          ASSERT_THAT(got.status(), IsOk()) << "rank " << r << " step " << step;
          seen[r].push_back(*got);
          if (step_time > absl::ZeroDuration()) absl::SleepFor(step_time);
          if (jitter) jitter(r, rng);
          // Rank r is the slowest of the group at steps r, r + size, ...
          ASSERT_THAT(d.ReportTelemetry({.step = step,
                                         .mode = got->mode,
                                         .reason = got->reason,
                                         .step_time_s = step % size == r ? 0.2 : 0.1,
                                         .rs_wait_s = 0.005 * (r + 1),
                                         .effective_tokens = std::accumulate(
                                             lengths(step).begin(), lengths(step).end(),
                                             int64_t{0}),  // the plan's: at most that
                                         .peak_memory_bytes = 1000u + r}),
                      IsOk());
        }
      });
    }
    for (auto& t : threads) t.join();
  }

  // Steps where ranks disagree (must be 0).
  int Disagreements() const {
    int bad = 0;
    for (size_t i = 0; i < seen[0].size(); ++i) {
      for (int r = 1; r < size; ++r) {
        if (seen[r].size() != seen[0].size() || !(seen[r][i] == seen[0][i])) {
          ++bad;
          break;
        }
      }
    }
    return bad;
  }
};

class GateClientE2ETest : public ::testing::Test {
 protected:
  void StartDaemon(int port = 0) {
    server::DaemonOptions o;
    o.listen = absl::StrCat("127.0.0.1:", port);
    o.state.heartbeat_interval = absl::Milliseconds(200);
    auto d = server::Daemon::Start(o);
    ASSERT_THAT(d.status(), IsOk());
    daemon_ = std::move(*d);
    port_ = daemon_->worker_port();
    controller_ = daemon_->worker_address();
  }
  void StopDaemon() {
    daemon_->Shutdown(absl::Seconds(2));
    daemon_.reset();
  }
  void TearDown() override {
    if (daemon_) StopDaemon();
  }

  std::unique_ptr<server::Daemon> daemon_;
  int port_ = 0;
  std::string controller_;
};

TEST_F(GateClientE2ETest, DecisionsArriveBeforeTheDeadlineOnAHealthyStream) {
  StartDaemon();
  Group g;
  ASSERT_NO_FATAL_FAILURE(g.Init(controller_, "e2e-healthy", 0, 2, absl::Milliseconds(200)));
  ASSERT_THAT(g.WaitConnected(), IsOk());
  auto lengths = [](int64_t step) -> const std::vector<int64_t>& {
    return step % 4 == 0 ? kMixed : kEven;
  };
  ASSERT_NO_FATAL_FAILURE(g.Run(0, 200, lengths, absl::Milliseconds(3)));
  EXPECT_EQ(g.Disagreements(), 0);
  int sp = 0, tp = 0;
  for (const GateDecision& d : g.seen[0]) {
    EXPECT_EQ(d.source, DecisionSource::kDaemon) << "step " << d.step << " was decided locally";
    (d.mode == Mode::kSequenceParallel ? sp : tp)++;
  }
  EXPECT_EQ(tp, 50);
  EXPECT_EQ(sp, 150);
  EXPECT_EQ(g.clients[0]->stats().local_decisions, 0);
  // The answers themselves came well inside the default 20 ms deadline.
  std::vector<double> lat;
  for (const GateClient::DecisionLatency& l : g.clients[0]->TakeDecisionLatencies()) {
    // Every plan waits for the client's writer a little (it is taken on another thread
    // after SubmitPlan returns), and then for the network and the daemon.
    EXPECT_GT(l.queued_s, 0);
    EXPECT_LT(l.queued_s, l.total_s);
    lat.push_back(l.total_s);
  }
  ASSERT_GE(lat.size(), 200u);  // plus step 200's, submitted during step 199
  std::sort(lat.begin(), lat.end());
  EXPECT_LT(lat[lat.size() / 2], 0.020) << "median plan-to-decision latency";
  EXPECT_TRUE(g.clients[0]->TakeDecisionLatencies().empty()) << "taken once";
  // Every rank's telemetry reaches the daemon.
  for (auto& c : g.clients) {
    ASSERT_THAT(c->Flush(absl::Seconds(10)), IsOk());
    EXPECT_EQ(c->stats().telemetry_acked, 200);
  }
}

// The clients' default: the leader's session speaks for the group. One client for four
// ranks, one record a step reaches the daemon (reduced in the group: every rank reported),
// and the decisions are the daemon's and the same on every rank, as with a session per rank.
TEST_F(GateClientE2ETest, AGroupSessionCarriesTheGroupsTelemetryInOneRecordAStep) {
  StartDaemon();
  Group g;
  ASSERT_NO_FATAL_FAILURE(g.Init(controller_, "e2e-group-session", 0, 4, absl::Milliseconds(200),
                                 /*group_session=*/true));
  ASSERT_EQ(g.clients.size(), 1u) << "the followers have no client";
  ASSERT_THAT(g.WaitConnected(), IsOk());
  auto lengths = [](int64_t step) -> const std::vector<int64_t>& {
    return step % 4 == 0 ? kMixed : kEven;
  };
  ASSERT_NO_FATAL_FAILURE(g.Run(0, 60, lengths));
  EXPECT_EQ(g.Disagreements(), 0);
  for (const GateDecision& d : g.seen[0]) EXPECT_EQ(d.source, DecisionSource::kDaemon);
  ASSERT_THAT(g.clients[0]->Flush(absl::Seconds(10)), IsOk());
  const GateClientStats st = g.clients[0]->stats();
  EXPECT_EQ(st.telemetry_reported, 60) << "one record a step for the group, not one per rank";
  EXPECT_EQ(st.telemetry_acked, 60);
  EXPECT_EQ(st.registrations, 1);
}

// Rank 0 of group 0 registers again from "another process" (a second client, the same
// launch and credential): the daemon ends the first session's stream ABORTED, and the
// first client leaves the seat to the second — it neither reconnects nor registers again,
// so the second keeps its session and the daemon's answers — and decides locally. A
// client with another credential for the launch is refused and never connects.
TEST_F(GateClientE2ETest, ASeatTakenWithTheCredentialIsNotFoughtOver) {
  StartDaemon();
  auto options = [&](const std::string& credential) {
    GateClientOptions o;
    o.controller = controller_;
    o.job_id = "e2e-seat";
    o.incarnation = "test-launch";
    o.launch_credential = credential;
    o.initial_backoff = absl::Milliseconds(20);
    o.max_backoff = absl::Milliseconds(100);
    o.decision_deadline = absl::Milliseconds(500);
    return o;
  };
  const std::string credential = "0123456789abcdef0123456789abcdef";
  auto first = GateClient::Create(options(credential));
  ASSERT_THAT(first.status(), IsOk());
  ASSERT_THAT((*first)->WaitUntilConnected(absl::Seconds(10)), IsOk());
  auto second = GateClient::Create(options(credential));
  ASSERT_THAT(second.status(), IsOk());
  ASSERT_THAT((*second)->WaitUntilConnected(absl::Seconds(10)), IsOk());
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (!(*first)->stats().session_replaced && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  absl::SleepFor(absl::Milliseconds(500));  // many backoff periods
  const GateClientStats a = (*first)->stats(), b = (*second)->stats();
  EXPECT_TRUE(a.session_replaced);
  EXPECT_THAT(a.last_error, ::testing::HasSubstr("ABORTED: session replaced"));
  EXPECT_EQ(a.registrations, 1);
  EXPECT_FALSE(a.connected);
  EXPECT_FALSE(b.session_replaced);
  EXPECT_TRUE(b.connected);
  EXPECT_EQ(b.registrations, 1);
  EXPECT_EQ(b.streams_opened, 1) << "the second client's session was taken back";
  ASSERT_THAT((*first)->SubmitPlan({.step = 0, .lengths = kMixed}), IsOk());
  ASSERT_THAT((*second)->SubmitPlan({.step = 0, .lengths = kMixed}), IsOk());
  auto da = (*first)->AwaitDecision(0);
  auto db = (*second)->AwaitDecision(0);
  ASSERT_THAT(da.status(), IsOk());
  ASSERT_THAT(db.status(), IsOk());
  EXPECT_EQ(da->source, DecisionSource::kFallback);
  EXPECT_EQ(db->source, DecisionSource::kDaemon);

  auto stranger = GateClient::Create(options("fedcba9876543210fedcba9876543210"));
  ASSERT_THAT(stranger.status(), IsOk());
  // The daemon's refusal ends the waits at once, with its code and reason (the client
  // keeps retrying in the background), instead of running out their timeouts.
  const absl::Time asked = absl::Now();
  EXPECT_THAT((*stranger)->WaitUntilConnected(absl::Seconds(10)),
              ::spgate::testing::StatusIs(absl::StatusCode::kPermissionDenied,
                                          ::testing::HasSubstr("launch_credential: does not match")));
  EXPECT_THAT((*stranger)->Flush(absl::Seconds(10)),
              ::spgate::testing::StatusIs(absl::StatusCode::kPermissionDenied,
                                          ::testing::HasSubstr("refused this client's credential")));
  EXPECT_LT(absl::Now() - asked, absl::Seconds(5)) << "a wait ran on after the refusal";
  EXPECT_TRUE((*second)->stats().connected) << "a wrong credential took the seat";
}

TEST_F(GateClientE2ETest, DaemonAwayThenBack) {
  StartDaemon();
  const std::string job = "e2e-restart";
  Group g;
  ASSERT_NO_FATAL_FAILURE(g.Init(controller_, job, 0, 4, absl::Milliseconds(200)));
  ASSERT_THAT(g.WaitConnected(), IsOk());
  auto mixed = [](int64_t) -> const std::vector<int64_t>& { return kMixed; };
  ASSERT_NO_FATAL_FAILURE(g.Run(0, 20, mixed, absl::Milliseconds(2)));

  // Daemon gone: every decision is the local policy's, at once, and identical on all
  // ranks.
  std::vector<int64_t> opened_before;
  for (auto& c : g.clients) opened_before.push_back(c->stats().streams_opened);
  StopDaemon();
  const absl::Time start = absl::Now();
  ASSERT_NO_FATAL_FAILURE(g.Run(20, 120, mixed));
  EXPECT_LT(absl::Now() - start, absl::Seconds(100 * 0.020)) << "fallback waited for the daemon";
  EXPECT_EQ(g.Disagreements(), 0);
  // Step 20's plan went out during step 19, so the daemon may have answered it in time.
  for (size_t i = 21; i < 120; ++i) {
    const GateDecision& d = g.seen[0][i];
    EXPECT_EQ(d.source, DecisionSource::kFallback) << "step " << d.step;
    EXPECT_EQ(d.reason, Reason::kControllerUnavailable);
    EXPECT_EQ(d.policy_reason, Reason::kLengthCv);
    EXPECT_EQ(d.mode, Mode::kTensorParallelOnly);
  }
  const int64_t local_count = g.clients[0]->stats().local_decisions;
  EXPECT_GE(local_count, 99);
  EXPECT_LE(local_count, 100);
  // While the daemon is away the clients try to reconnect (backoff 0.1 s, 0.2 s, 0.4 s, ...:
  // about three tries in this second and a half). Each try opens a stream whose first
  // write fails, and the telemetry reported meanwhile must stay buffered through them, not
  // go out on those doomed writes: at most what was in flight when the daemon stopped
  // counts as sent.
  absl::SleepFor(absl::Milliseconds(1500));
  for (size_t r = 0; r < g.clients.size(); ++r) {
    const GateClientStats st = g.clients[r]->stats();
    EXPECT_GT(st.streams_opened, opened_before[r])
        << "rank " << r << " did not retry while the daemon was away";
    EXPECT_LE(st.telemetry_sent, 22) << "rank " << r
                                     << ": records went out on streams the daemon never answered";
  }

  // Back on the same port: the clients reconnect (new sessions) in bounded time and the
  // leader's heartbeat reports its local decisions.
  StartDaemon(port_);
  const absl::Time back = absl::Now();
  ASSERT_THAT(g.WaitConnected(), IsOk());
  const absl::Duration reconnect = absl::Now() - back;
  EXPECT_LT(reconnect, absl::Seconds(10));
  EXPECT_EQ(g.clients[0]->stats().registrations, 2);
  double local = -1;
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (absl::Now() < give_up) {
    local = ::spgate::testing::MetricValue(::spgate::testing::ScrapeMetrics(daemon_->metrics_port()), "spgate_worker_local_decisions_total",
                        {"job_id=\"" + job + "\"", "reason=\"length_cv\""});
    if (local == static_cast<double>(local_count)) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(local, static_cast<double>(local_count))
      << "local decisions did not reach the daemon's metrics";
  // And decisions come from the daemon again.
  ASSERT_NO_FATAL_FAILURE(g.Run(120, 160, mixed, absl::Milliseconds(3)));
  EXPECT_EQ(g.seen[0].back().source, DecisionSource::kDaemon);
  EXPECT_EQ(g.Disagreements(), 0);
  // The records of the outage reached the daemon once it was back. Unacknowledged
  // (lost) can only be records the first daemon had before it stopped (steps 0-19; it
  // acknowledges with each 200 ms heartbeat, and those steps took tens of ms).
  for (auto& c : g.clients) {
    ASSERT_THAT(c->Flush(absl::Seconds(10)), IsOk());
    const GateClientStats st = c->stats();
    EXPECT_EQ(st.telemetry_dropped, 0);
    EXPECT_LE(st.telemetry_sent - st.telemetry_acked, 20);
    EXPECT_GE(st.telemetry_acked, 140) << "steps 20-159, reported after the first daemon left";
  }
}

TEST_F(GateClientE2ETest, ConfigUpdateAppliesExactlyAtEffectiveStepOnEveryRank) {
  StartDaemon();
  const std::string job = "e2e-config";
  Group g;
  ASSERT_NO_FATAL_FAILURE(g.Init(controller_, job, 0, 3, absl::Milliseconds(200)));
  ASSERT_THAT(g.WaitConnected(), IsOk());
  auto admin = v1::AdminService::NewStub(
      grpc::CreateChannel(daemon_->admin_address(), grpc::InsecureChannelCredentials()));
  // Batches with CV 0.25: TP-only under the default max_length_cv 0.18, SP under 0.5.
  auto mid = [](int64_t) -> const std::vector<int64_t>& { return kMid; };
  int64_t new_version = 0;
  auto update_at_30 = [&](int64_t step) {
    if (step != 30) return;
    v1::UpdateGateConfigRequest req;
    req.set_job_id(job);
    req.mutable_config()->set_max_length_cv(0.5);
    req.mutable_update_mask()->add_paths("max_length_cv");
    v1::VersionedGateConfig resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::Status s = admin->UpdateGateConfig(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    new_version = resp.effective_version();
  };
  ASSERT_NO_FATAL_FAILURE(g.Run(0, 100, mid, absl::Milliseconds(3), update_at_30));
  EXPECT_EQ(g.Disagreements(), 0);
  ASSERT_GT(new_version, 0);
  const ScheduledConfig cfg = g.clients[0]->ConfigFor(99);
  ASSERT_EQ(cfg.version, new_version) << "the update never reached the leader";
  const int64_t efs = cfg.effective_from_step;
  EXPECT_GT(efs, 30);
  EXPECT_LT(efs, 100);
  for (int r = 0; r < g.size; ++r) {
    for (const GateDecision& d : g.seen[r]) {
      EXPECT_EQ(d.source, DecisionSource::kDaemon) << "rank " << r << " step " << d.step;
      if (d.step < efs) {
        EXPECT_NE(d.config_version, new_version) << "rank " << r << " step " << d.step;
        EXPECT_EQ(d.mode, Mode::kTensorParallelOnly) << "rank " << r << " step " << d.step;
      } else {
        EXPECT_EQ(d.config_version, new_version) << "rank " << r << " step " << d.step;
        EXPECT_EQ(d.mode, Mode::kSequenceParallel) << "rank " << r << " step " << d.step;
      }
    }
  }
}

TEST_F(GateClientE2ETest, GroupsStayConsistentUnderDelaysAndARestart) {
  StartDaemon();
  constexpr int kGroups = 3, kRanks = 4;
  constexpr int64_t kSteps = 2000, kRestartAt = 600;
  std::vector<Group> groups(kGroups);
  for (int i = 0; i < kGroups; ++i) {
    ASSERT_NO_FATAL_FAILURE(groups[i].Init(controller_, "e2e-chaos", i, kRanks));
    groups[i].jitter = [](int, std::mt19937& rng) {
      if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
    };
  }
  for (auto& g : groups) ASSERT_THAT(g.WaitConnected(), IsOk());
  auto lengths = [](int64_t step) -> const std::vector<int64_t>& {
    static const std::vector<int64_t>* kinds[] = {&kEven, &kMixed, &kMid, &kEven, &kEven};
    return *kinds[(step * 7919) % 5];
  };
  std::atomic<int64_t> progress{0};
  std::vector<std::thread> runners;
  for (int i = 0; i < kGroups; ++i) {
    runners.emplace_back([&, i] {
      groups[i].Run(0, kSteps, lengths, absl::Microseconds(300), [&, i](int64_t step) {
        if (i == 0) progress.store(step);
      });
    });
  }
  while (progress.load() < kRestartAt) absl::SleepFor(absl::Milliseconds(5));
  StopDaemon();
  absl::SleepFor(absl::Milliseconds(200));
  StartDaemon(port_);
  for (auto& t : runners) t.join();

  int64_t fallback = 0, daemon = 0;
  for (auto& g : groups) {
    EXPECT_EQ(g.Disagreements(), 0) << "group " << g.index;
    ASSERT_EQ(g.seen[0].size(), static_cast<size_t>(kSteps));
    for (const GateDecision& d : g.seen[0]) {
      (d.source == DecisionSource::kFallback ? fallback : daemon)++;
    }
  }
  EXPECT_GT(fallback, 0) << "the restart never forced a local decision";
  EXPECT_GT(daemon, 0);
  // Everyone finds the restarted daemon.
  for (auto& g : groups) {
    ASSERT_THAT(g.WaitConnected(), IsOk());
    EXPECT_GE(g.clients[0]->stats().registrations, 2);
  }
}

}  // namespace
}  // namespace spgate::client
