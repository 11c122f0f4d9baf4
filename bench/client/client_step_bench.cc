// Per-step cost of the worker client on the training thread (target: <= 5 us median):
// SubmitPlan(n + 1) + AwaitDecision(n) with the daemon's decision already there +
// ReportTelemetry(n), timed per step with steady_clock, against a real spgated
// started in this process (Daemon::Start on 127.0.0.1:0). Between the calls the loop
// "runs the step" (a sleep, untimed), so the decision for n arrives while n - 1 runs —
// the pipelined shape of docs/design.md §4.
//
// Baselines measured in the same run, with the same batch and loop:
//   handoff     — the floor of any non-blocking client: copy the lengths into a
//                 mutex-guarded queue and signal a consumer thread (plan), read a
//                 decision from a mutex-guarded map (await), push a telemetry record
//                 (report). No protobuf, no gRPC, no policy.
//   local_only  — the same GateClient calls without a controller: the local policy
//                 decides every step (the network hand-off is the difference).
// And the group session's path (docs/design.md §2), gate_client_group8: the leader of an
// 8-rank group reports through GroupDecider::ReportTelemetry, whose reduction here takes
// the element-wise max with 7 payloads the other ranks "sent" (made beforehand): what
// spgate adds on the training thread (pack, combine, decode, queue one group record),
// without the collective's transfer, which is the communicator's (an MPI_Reduce or
// all-reduce of 120 bytes; docs/benchmarks.md gives it separately).
// Reports median / p99 / p99.9 per step and ratios to `handoff`, and writes JSON.
// --variants runs some of the client variants only (`handoff`, the baseline, always runs):
// bench/client/step_instructions.py counts one variant's instructions under callgrind.
//
//   build/bench/client_step_bench --steps=5000 --step_us=1000 --sequences=16
//       --out=client_step.json
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <fstream>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/mutex.h"
#include "policy/telemetry.h"
#include "server/daemon.h"
#include "worker/client/gate_client.h"
#include "worker/client/group_decider.h"

ABSL_FLAG(int, steps, 5000, "Measured steps per variant");
ABSL_FLAG(int, warmup, 200, "Unmeasured steps first");
ABSL_FLAG(int, step_us, 1000,
          "Simulated step time between the calls (untimed); 0: hot loop that only waits "
          "for the next decision");
ABSL_FLAG(int, sequences, 16, "Sequences per batch plan");
ABSL_FLAG(std::string, out, "", "Write results as JSON here");
ABSL_FLAG(std::string, variants, "local_only,gate_client,gate_client_group8",
          "Client variants to run, comma-separated (handoff, the baseline, always runs)");
ABSL_FLAG(bool, mutex_deadlock_detection, true,
          "Leave Abseil's mutex deadlock detection as the library left it (on in Debian's "
          "build, as in a trainer that does not turn it off); false: "
          "spgate::DisableMutexDeadlockDetection() first");

namespace {

using Clock = std::chrono::steady_clock;
using spgate::client::BatchPlanInput;
using spgate::client::DecisionSource;
using spgate::client::GateClient;
using spgate::client::GateClientOptions;
using spgate::client::StepTelemetryInput;

struct Result {
  std::string name;
  std::vector<double> step_ns, submit_ns, await_ns, report_ns;
  int64_t not_from_daemon = 0;
  int64_t stalled = 0;  // steps whose answer had not come after a second
};

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  return v[i];
}

std::vector<int64_t> Batch(int n) {
  std::mt19937 rng(1);
  std::lognormal_distribution<double> d(std::log(4096.0) - 0.32, 0.8);
  std::vector<int64_t> v(n);
  for (auto& x : v) x = std::clamp<int64_t>(static_cast<int64_t>(d(rng)), 16, 32768);
  return v;
}

// A step's record; `lengths` is its plan, whose tokens a record claims at most.
StepTelemetryInput Telemetry(int64_t step, spgate::Mode mode, spgate::Reason reason,
                             const std::vector<int64_t>& lengths) {
  return {.step = step, .mode = mode, .reason = reason, .step_time_s = 0.1, .rs_wait_s = 0.004,
          .all_gather_s = 0.003,
          .effective_tokens = std::accumulate(lengths.begin(), lengths.end(), int64_t{0}),
          .peak_memory_bytes = 40ull << 30, .microbatches = {}};
}

// The "handoff" floor: what any client that hands work to a network thread must do.
class Handoff {
 public:
  Handoff() : consumer_([this] { Consume(); }) {}
  ~Handoff() {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
      cv_.Signal();
    }
    consumer_.join();
  }
  void Submit(int64_t step, std::span<const int64_t> lengths) {
    absl::MutexLock l(&mu_);
    plans_.emplace_back(step, std::vector<int64_t>(lengths.begin(), lengths.end()));
    cv_.Signal();
  }
  bool Await(int64_t step) {
    absl::MutexLock l(&mu_);
    auto it = decisions_.find(step);
    if (it == decisions_.end()) return false;
    decisions_.erase(it);
    return true;
  }
  bool Ready(int64_t step) {
    absl::MutexLock l(&mu_);
    return decisions_.contains(step);
  }
  void Report(const StepTelemetryInput& t) {
    absl::MutexLock l(&mu_);
    telemetry_.push_back(t);
    if (telemetry_.size() > 4096) telemetry_.pop_front();
  }

 private:
  void Consume() {
    absl::MutexLock l(&mu_);
    while (!stop_) {
      while (!plans_.empty()) {
        decisions_[plans_.front().first] = 1;
        plans_.pop_front();
      }
      cv_.Wait(&mu_);
    }
  }
  absl::Mutex mu_;
  absl::CondVar cv_;
  bool stop_ = false;
  std::deque<std::pair<int64_t, std::vector<int64_t>>> plans_;
  absl::flat_hash_map<int64_t, int> decisions_;
  std::deque<StepTelemetryInput> telemetry_;
  std::thread consumer_;
};

// The untimed "step" between iterations: a sleep of --step_us (caches and branch
// predictors go cold, as across a real training step; 0: none, hot caches), then a yield
// loop until `ready(n)` says decision n is there — the benchmark times the case where
// the pipelined decision has arrived, not the daemon's latency.
// A step whose answer never came within a second is counted (`stalled`): the loop's
// figures are then the fallback's, and the JSON says how many.
template <typename Ready>
bool RunStep(int64_t next, Ready ready) {
  const int us = absl::GetFlag(FLAGS_step_us);
  if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
  const auto give_up = Clock::now() + std::chrono::seconds(1);
  while (!ready(next)) {
    if (Clock::now() >= give_up) return false;
    std::this_thread::yield();
  }
  return true;
}

template <typename Submit, typename Await, typename Report, typename Ready>
void Loop(Result& r, int warmup, int steps, Submit submit, Await await, Report report,
          Ready ready) {
  submit(0);
  if (!RunStep(0, ready)) ++r.stalled;
  for (int64_t n = 0; n < warmup + steps; ++n) {
    const auto t0 = Clock::now();
    submit(n + 1);
    const auto t1 = Clock::now();
    await(n);
    const auto t2 = Clock::now();
    report(n);
    const auto t3 = Clock::now();
    if (n >= warmup) {
      auto ns = [](auto a, auto b) { return std::chrono::duration<double, std::nano>(b - a).count(); };
      r.submit_ns.push_back(ns(t0, t1));
      r.await_ns.push_back(ns(t1, t2));
      r.report_ns.push_back(ns(t2, t3));
      r.step_ns.push_back(ns(t0, t1) + ns(t1, t2) + ns(t2, t3));
    }
    if (!RunStep(n + 1, ready)) ++r.stalled;  // the step runs; decision n + 1 arrives
  }
}

// `group_size` > 1: the leader of a group session, telemetry through a GroupDecider whose
// reduction combines the other ranks' ready-made payloads.
Result RunClient(const std::string& name, const std::string& controller,
                 const std::vector<int64_t>& lengths, int warmup, int steps,
                 int group_size = 1) {
  GateClientOptions o;
  o.controller = controller;
  o.job_id = "bench-" + name;  // a job per variant: each starts at step 0
  o.incarnation = "test-launch";
  o.launch_credential = "client-step-bench-launch";
  o.group_size = group_size;
  auto client = GateClient::Create(o);
  if (!client.ok()) {
    std::fprintf(stderr, "client: %s\n", client.status().ToString().c_str());
    std::exit(1);
  }
  GateClient& c = **client;
  if (!controller.empty()) {
    if (absl::Status s = c.WaitUntilConnected(absl::Seconds(10)); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      std::exit(1);
    }
  }
  std::unique_ptr<spgate::client::GroupDecider> decider;
  int64_t others_step = -1;
  spgate::Mode others_mode = spgate::Mode::kSequenceParallel;
  std::vector<spgate::client::TelemetryWire> others(static_cast<size_t>(group_size - 1));
  std::vector<double> others_busy(others.size());
  if (group_size > 1) {
    auto d = spgate::client::GroupDecider::Create(
        &c, 0, [](std::span<uint8_t>, int) { return absl::OkStatus(); },
        [&](std::span<double> w, int) {
          constexpr int kHead = spgate::client::TelemetryWire::kSlots;
          for (size_t k = 0; k < others.size(); ++k) {
            for (int i = 0; i < kHead; ++i) w[i] = std::max(w[i], others[k].v[i]);
            // Rank k + 1's busy time in its slot after the payload (StragglerSlots).
            w[kHead + k + 1] = std::max(w[kHead + k + 1], others_busy[k]);
          }
          return absl::OkStatus();
        });
    if (!d.ok()) {
      std::fprintf(stderr, "decider: %s\n", d.status().ToString().c_str());
      std::exit(1);
    }
    decider = *std::move(d);
  }
  Result r;
  r.name = name;
  spgate::Mode mode = spgate::Mode::kSequenceParallel;
  spgate::Reason reason = spgate::Reason::kGatesPassed;
  // The other ranks' payloads for a step, made outside the timed calls (they arrive with
  // the collective).
  auto prepare_others = [&](int64_t step) {
    if (others_step == step && others_mode == mode) return;
    others_step = step;
    others_mode = mode;
    for (int k = 1; k < group_size; ++k) {
      StepTelemetryInput t = Telemetry(step, mode, reason, lengths);
      t.step_time_s *= 1.0 + 0.01 * k;
      others[static_cast<size_t>(k - 1)] = spgate::client::ToTelemetryWire(t, k);
      others_busy[static_cast<size_t>(k - 1)] =
          spgate::BusySeconds(t.step_time_s, t.rs_wait_s, t.all_gather_s, t.norm_stall_s);
    }
  };
  Loop(
      r, warmup, steps,
      [&](int64_t step) {
        (void)c.SubmitPlan(BatchPlanInput{.step = step, .lengths = lengths, .microbatches = {}});
      },
      [&](int64_t step) {
        auto d = c.AwaitDecision(step, absl::Now() + c.options().decision_deadline);
        if (d.ok()) {
          mode = d->mode;
          reason = d->reason;
          if (!controller.empty() && d->source != DecisionSource::kDaemon && step >= warmup) {
            ++r.not_from_daemon;
          }
        }
      },
      [&](int64_t step) {
        if (decider) {
          // Made before the step's report (in the untimed step below); again here only
          // when the mode changed since (the first step, a mode switch).
          prepare_others(step);
          if (absl::Status s = decider->ReportTelemetry(Telemetry(step, mode, reason, lengths));
              !s.ok()) {
            // Timing an error path would flatter the figure: stop instead.
            std::fprintf(stderr, "%s: step %lld: %s\n", name.c_str(), static_cast<long long>(step),
                         s.ToString().c_str());
            std::exit(1);
          }
        } else {
          (void)c.ReportTelemetry(Telemetry(step, mode, reason, lengths));
        }
      },
      [&](int64_t step) {
        if (decider) prepare_others(step);
        // Every plan gets one answer, in step order: a decision before its step is
        // committed, one after it (late: the fallback had decided it), or a refusal. A
        // count of the first kind alone would lag by one for good after one late or
        // refused plan, and every later step would wait out RunStep's second. (A refusal
        // after its step was decided locally is not counted by the client; with the
        // daemon's limits off nothing here is refused.)
        if (controller.empty()) return true;
        const spgate::client::GateClientStats st = c.stats();
        return st.decisions_received + st.late_decisions + st.plans_rejected >= step + 1;
      });
  if (!controller.empty()) (void)c.Flush(absl::Seconds(5));
  return r;
}

Result RunHandoff(const std::vector<int64_t>& lengths, int warmup, int steps) {
  Handoff h;
  Result r;
  r.name = "handoff";
  Loop(
      r, warmup, steps, [&](int64_t step) { h.Submit(step, lengths); },
      [&](int64_t step) { (void)h.Await(step); },
      [&](int64_t step) {
        h.Report(Telemetry(step, spgate::Mode::kSequenceParallel, spgate::Reason::kGatesPassed,
                           lengths));
      },
      [&](int64_t step) { return h.Ready(step); });
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_mutex_deadlock_detection)) spgate::DisableMutexDeadlockDetection();
  const int steps = absl::GetFlag(FLAGS_steps);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const std::vector<int64_t> lengths = Batch(absl::GetFlag(FLAGS_sequences));
  const std::vector<std::string> known = {"local_only", "gate_client", "gate_client_group8"};
  const std::vector<std::string> variants =
      absl::StrSplit(absl::GetFlag(FLAGS_variants), ',', absl::SkipEmpty());
  for (const std::string& v : variants) {
    if (std::find(known.begin(), known.end(), v) == known.end()) {
      std::fprintf(stderr, "--variants: unknown variant \"%s\" (known: %s)\n", v.c_str(),
                   absl::StrJoin(known, ", ").c_str());
      return 2;
    }
  }
  if (variants.empty()) {
    std::fprintf(stderr, "--variants: name at least one of %s\n",
                 absl::StrJoin(known, ", ").c_str());
    return 2;
  }
  const auto wanted = [&](const std::string& v) {
    return std::find(variants.begin(), variants.end(), v) != variants.end();
  };

  // The client's path, not the daemon's limits: the hot loop (--step_us=0) asks for
  // several thousand plans a second, past the default --max_plans_per_second (1,000, bursts
  // of 2,000), and a refused plan is decided by the fallback (docs/reliability.md, Limits).
  spgate::server::DaemonOptions daemon_options;
  daemon_options.state.max_plans_per_second = 0;
  daemon_options.state.max_telemetry_per_second = 0;
  auto daemon = spgate::server::Daemon::Start(daemon_options);
  if (!daemon.ok()) {
    std::fprintf(stderr, "daemon: %s\n", daemon.status().ToString().c_str());
    return 1;
  }
  std::vector<Result> results;
  results.push_back(RunHandoff(lengths, warmup, steps));
  if (wanted("local_only")) results.push_back(RunClient("local_only", "", lengths, warmup, steps));
  if (wanted("gate_client")) {
    results.push_back(
        RunClient("gate_client", (*daemon)->worker_address(), lengths, warmup, steps));
  }
  if (wanted("gate_client_group8")) {
    results.push_back(RunClient("gate_client_group8", (*daemon)->worker_address(), lengths,
                                warmup, steps, /*group_size=*/8));
  }
  (*daemon)->Shutdown(absl::Seconds(2));

  const double base = Quantile(results[0].step_ns, 0.5);
  std::printf("\nper-step client cost on the training thread (%d steps, %d sequences/plan, "
              "%d us simulated step)\n\n",
              steps, absl::GetFlag(FLAGS_sequences), absl::GetFlag(FLAGS_step_us));
  std::printf("| variant | median ns | p99 ns | p99.9 ns | submit p50/p99 | await p50/p99 | "
              "report p50/p99 | x handoff (median) | not from daemon | stalled |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::string json = "{\n  \"benchmark\": \"client_step\",\n  \"baseline\": \"handoff\",\n";
  json += absl::StrFormat("  \"steps\": %d, \"sequences\": %d, \"step_us\": %d,\n  \"results\": [\n",
                          steps, absl::GetFlag(FLAGS_sequences), absl::GetFlag(FLAGS_step_us));
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    const double med = Quantile(r.step_ns, 0.5), p99 = Quantile(r.step_ns, 0.99),
                 p999 = Quantile(r.step_ns, 0.999);
    std::printf("| %s | %.0f | %.0f | %.0f | %.0f / %.0f | %.0f / %.0f | %.0f / %.0f | %.2f | %lld | %lld |\n",
                r.name.c_str(), med, p99, p999, Quantile(r.submit_ns, 0.5),
                Quantile(r.submit_ns, 0.99), Quantile(r.await_ns, 0.5), Quantile(r.await_ns, 0.99),
                Quantile(r.report_ns, 0.5), Quantile(r.report_ns, 0.99), med / base,
                static_cast<long long>(r.not_from_daemon), static_cast<long long>(r.stalled));
    json += absl::StrFormat(
        "    {\"name\": \"%s\", \"median_ns\": %.1f, \"p99_ns\": %.1f, \"p999_ns\": %.1f, "
        "\"submit_p50_ns\": %.1f, \"await_p50_ns\": %.1f, \"report_p50_ns\": %.1f, "
        "\"ratio_to_baseline\": %.3f, \"not_from_daemon\": %d, \"stalled\": %d}%s\n",
        r.name, med, p99, p999, Quantile(r.submit_ns, 0.5), Quantile(r.await_ns, 0.5),
        Quantile(r.report_ns, 0.5), med / base, r.not_from_daemon, r.stalled,
        i + 1 < results.size() ? "," : "");
  }
  json += "  ]\n}\n";
  if (!absl::GetFlag(FLAGS_out).empty()) {
    std::ofstream(absl::GetFlag(FLAGS_out)) << json;
    std::printf("\nwrote %s\n", absl::GetFlag(FLAGS_out).c_str());
  }
  return 0;
}
