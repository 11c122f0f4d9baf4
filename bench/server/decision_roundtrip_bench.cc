// Decision round trip through the Connect stream, against the physical limit of the
// transport: a bare echo service with the same stream shape (WorkerMessage in,
// DaemonMessage out, one Decision per plan) served from this same process. Each
// concurrent group is a leader in a closed loop — send step N's plan, wait for its
// decision, send N+1 — on its own connection. Echo and spgated runs alternate so that
// machine noise hits both; the report is p50/p99 latency and decisions/s as ratios to
// echo. Loopback only; every loop is bounded by --seconds.
//
// With --microbatches=1,8,64 the plans are step plans (docs/design.md §12) of a
// pipelined job (pp = 4; each group a stage of a replica), one MicroBatchPlan of
// --sequences lengths per micro-batch, answered with a decision per micro-batch (the
// echo answers as many); decisions/s then counts micro-batch decisions.
//
//   build/bin/decision_roundtrip_bench --groups=1,16,128 --seconds=3 --rounds=3
//       --out=decision_roundtrip.json
//   build/bin/decision_roundtrip_bench --groups=16 --microbatches=1,8,64 --sequences=8
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/mutex.h"
#include "server/daemon.h"
#include "spgate/v1/gate.grpc.pb.h"

ABSL_FLAG(std::string, groups, "1,16,128", "Concurrent groups (leaders) to measure");
ABSL_FLAG(double, seconds, 3.0, "Measured seconds per run");
ABSL_FLAG(int, rounds, 3, "Alternating echo/spgated rounds per group count");
ABSL_FLAG(int, sequences, 64, "Sequences per batch plan");
ABSL_FLAG(std::string, out, "", "Write results as JSON here");
ABSL_FLAG(std::string, microbatches, "",
          "Comma-separated micro-batches per step plan (empty: plain plans, one batch each)");

namespace {

using Clock = std::chrono::steady_clock;
namespace v1 = spgate::v1;

// The echo baseline: the same stream shape as GateService.Connect with no state.
class EchoReactor final : public grpc::ServerBidiReactor<v1::WorkerMessage, v1::DaemonMessage> {
 public:
  EchoReactor() { StartRead(&in_); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    out_.Clear();
    for (const auto& p : in_.plans()) {
      auto* d = out_.add_decisions();
      d->set_job_id(p.job_id());
      d->set_group(p.group());
      d->set_step(p.step());
      d->set_mode(v1::SEQUENCE_PARALLEL);
      d->set_reason(v1::GATES_PASSED);
      for (const auto& m : p.micro_batches()) {
        auto* md = d->add_micro_batches();
        md->set_id(m.id());
        md->set_mode(v1::SEQUENCE_PARALLEL);
        md->set_reason(v1::GATES_PASSED);
      }
    }
    StartWrite(&out_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::CANCELLED);
      return;
    }
    StartRead(&in_);
  }
  void OnDone() override { delete this; }

 private:
  v1::WorkerMessage in_;
  v1::DaemonMessage out_;
};

class EchoService final : public v1::GateService::CallbackService {
  grpc::ServerBidiReactor<v1::WorkerMessage, v1::DaemonMessage>* Connect(
      grpc::CallbackServerContext*) override {
    return new EchoReactor();
  }
};

struct RunResult {
  std::vector<double> latencies_us;
  double decisions_per_s = 0;
  int64_t errors = 0;
};

double Quantile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  size_t k = static_cast<size_t>(std::clamp(q * static_cast<double>(v.size()), 1.0,
                                            static_cast<double>(v.size()))) - 1;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
  return v[k];
}

std::shared_ptr<grpc::Channel> NewChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // one connection per leader
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

// `microbatches` 0: plain plans of `sequences` lengths; else step plans of that many
// micro-batches of `sequences` lengths each, from a job with a layout.
RunResult Run(const std::string& address, bool register_first, int groups, double seconds,
              const std::string& job, int sequences, int microbatches) {
  std::vector<int64_t> lengths;
  for (int i = 0; i < sequences; ++i) lengths.push_back(2048 + (i * 977) % 1024);
  std::vector<std::vector<double>> lat(static_cast<size_t>(groups));
  std::atomic<int64_t> total{0}, errors{0};
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  Clock::time_point start, stop;
  std::vector<std::thread> threads;
  for (int g = 0; g < groups; ++g) {
    threads.emplace_back([&, g] {
      auto channel = NewChannel(address);
      auto stub = v1::GateService::NewStub(channel);
      std::string session;
      if (register_first) {
        v1::RegisterRequest r;
        r.set_job_id(job);
        r.set_incarnation(job + "-bench");
        r.set_launch_credential("test-launch-credential-0001");
        r.set_group(g);
        r.set_group_size(1);
        if (microbatches > 0) {
          constexpr int kStages = 4;
          v1::JobLayout* l = r.mutable_layout();
          l->set_tp(1);
          l->set_pp(kStages);
          l->set_dp((groups + kStages - 1) / kStages);
          l->set_microbatches(microbatches);
          r.mutable_coordinates()->set_dp_index(g / kStages);
          r.mutable_coordinates()->set_stage(g % kStages);
        }
        v1::RegisterResponse resp;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        if (!stub->Register(&ctx, r, &resp).ok()) {
          errors++;
          ready++;
          return;
        }
        session = resp.session_id();
      }
      grpc::ClientContext ctx;
      auto stream = stub->Connect(&ctx);
      v1::WorkerMessage msg;
      msg.set_session_id(session);
      v1::BatchPlan* plan = msg.add_plans();
      plan->set_job_id(job);
      plan->set_group(g);
      if (microbatches == 0) {
        for (int64_t l : lengths) plan->add_lengths(l);
      } else {
        plan->set_resident_bytes(uint64_t{20} << 30);
        plan->set_memory_budget_bytes(uint64_t{80} << 30);
        for (int id = 0; id < microbatches; ++id) {
          v1::MicroBatchPlan* m = plan->add_micro_batches();
          m->set_id(id);
          for (int64_t l : lengths) m->add_lengths(l + id);
          m->set_activation_bytes_sp(uint64_t{1} << 30);
          m->set_activation_bytes_tp(uint64_t{2} << 30);
          m->set_workspace_bytes_sp(uint64_t{1} << 28);
          m->set_workspace_bytes_tp(uint64_t{1} << 29);
        }
      }
      v1::DaemonMessage in;
      int64_t step = 0;
      // Warm-up round trip (connection, session attach) outside the measurement.
      plan->set_step(step++);
      if (!stream->Write(msg) || !stream->Read(&in)) errors++;
      msg.clear_session_id();
      ready++;
      while (!go.load()) std::this_thread::yield();
      auto& mine = lat[static_cast<size_t>(g)];
      mine.reserve(100000);
      while (Clock::now() < stop) {
        plan->set_step(step++);
        const auto t0 = Clock::now();
        if (!stream->Write(msg) || !stream->Read(&in) || in.decisions_size() != 1) {
          errors++;
          break;
        }
        mine.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
      total += static_cast<int64_t>(mine.size()) * std::max(microbatches, 1);
      stream->WritesDone();
      stream->Finish();
    });
  }
  while (ready.load() < groups) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  start = Clock::now();
  stop = start + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
  go = true;
  for (auto& t : threads) t.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  RunResult r;
  for (auto& v : lat) r.latencies_us.insert(r.latencies_us.end(), v.begin(), v.end());
  r.decisions_per_s = static_cast<double>(total.load()) / elapsed;
  r.errors = errors.load();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  spgate::DisableMutexDeadlockDetection();  // as in spgated's main
  absl::ParseCommandLine(argc, argv);
  std::vector<int> mb_counts;
  if (!absl::GetFlag(FLAGS_microbatches).empty()) {
    for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_microbatches), ',')) {
      int n = 0;
      if (!absl::SimpleAtoi(s, &n) || n < 1 || n > 4096) {
        std::cerr << "--microbatches: expected a comma-separated list of 1..4096, got '" << s
                  << "'\n";
        return 2;
      }
      mb_counts.push_back(n);
    }
  } else {
    mb_counts.push_back(0);
  }
  std::vector<int> group_counts;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_groups), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(s, &n) || n < 1 || n > 1024) {
      std::cerr << "--groups: expected a comma-separated list of 1..1024, got '" << s << "'\n";
      return 2;
    }
    group_counts.push_back(n);
  }
  const double seconds = absl::GetFlag(FLAGS_seconds);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  if (seconds <= 0 || seconds > 60 || rounds < 1 || rounds > 20) {
    std::cerr << "--seconds must be in (0, 60] and --rounds in [1, 20]\n";
    return 2;
  }

  spgate::server::DaemonOptions opts;  // loopback, port 0
  // The benchmark measures the decision path: a closed-loop leader sends far more plans a
  // second than --max_plans_per_second allows a real one, so the limiter is off here.
  opts.state.max_plans_per_second = 0;
  auto daemon = spgate::server::Daemon::Start(opts);
  if (!daemon.ok()) {
    std::cerr << "cannot start spgated: " << daemon.status() << "\n";
    return 1;
  }
  EchoService echo;
  int echo_port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &echo_port);
  builder.RegisterService(&echo);
  auto echo_server = builder.BuildAndStart();
  const std::string echo_addr = absl::StrCat("127.0.0.1:", echo_port);

  std::string json = "{\n  \"benchmark\": \"decision_roundtrip\",\n  \"baseline\": \"echo\",\n"
                     "  \"results\": [\n";
  std::printf("%-7s %-6s %-8s %10s %10s %12s   %s\n", "groups", "mbs", "server", "p50_us",
              "p99_us", "decisions/s", "ratio to echo (p50, p99, throughput)");
  int run_id = 0;
  const size_t cases = group_counts.size() * mb_counts.size();
  size_t case_id = 0;
  for (const int n : group_counts) {
    for (const int mbs : mb_counts) {
      std::vector<double> echo_lat, gate_lat;
      double echo_tput = 0, gate_tput = 0;
      int64_t errors = 0;
      for (int r = 0; r < rounds; ++r) {
        RunResult e = Run(echo_addr, false, n, seconds, "echo", absl::GetFlag(FLAGS_sequences), mbs);
        RunResult g = Run((*daemon)->worker_address(), true, n, seconds,
                          absl::StrCat("bench-", run_id++), absl::GetFlag(FLAGS_sequences), mbs);
        echo_lat.insert(echo_lat.end(), e.latencies_us.begin(), e.latencies_us.end());
        gate_lat.insert(gate_lat.end(), g.latencies_us.begin(), g.latencies_us.end());
        echo_tput += e.decisions_per_s / rounds;
        gate_tput += g.decisions_per_s / rounds;
        errors += e.errors + g.errors;
      }
      const double e50 = Quantile(echo_lat, 0.5), e99 = Quantile(echo_lat, 0.99);
      const double g50 = Quantile(gate_lat, 0.5), g99 = Quantile(gate_lat, 0.99);
      std::printf("%-7d %-6d %-8s %10.1f %10.1f %12.0f\n", n, mbs, "echo", e50, e99, echo_tput);
      std::printf("%-7d %-6d %-8s %10.1f %10.1f %12.0f   %.2fx, %.2fx, %.2fx%s\n", n, mbs,
                  "spgated", g50, g99, gate_tput, g50 / e50, g99 / e99, gate_tput / echo_tput,
                  errors ? "  (errors!)" : "");
      absl::StrAppend(&json, "    {\"groups\": ", n, ", \"microbatches\": ", mbs,
                      ", \"echo\": {\"p50_us\": ", e50, ", \"p99_us\": ", e99,
                      ", \"decisions_per_s\": ", echo_tput, "}, \"spgated\": {\"p50_us\": ", g50,
                      ", \"p99_us\": ", g99, ", \"decisions_per_s\": ", gate_tput,
                      "}, \"ratio\": {\"p50\": ", g50 / e50, ", \"p99\": ", g99 / e99,
                      ", \"throughput\": ", gate_tput / echo_tput, "}, \"errors\": ", errors, "}",
                      ++case_id < cases ? "," : "", "\n");
    }
  }
  json += "  ]\n}\n";
  if (!absl::GetFlag(FLAGS_out).empty()) std::ofstream(absl::GetFlag(FLAGS_out)) << json;
  echo_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  (*daemon)->Shutdown(absl::Seconds(1));
  return 0;
}
