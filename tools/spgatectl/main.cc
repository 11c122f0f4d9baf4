// spgatectl: the operator CLI of spgated (docs/design.md §5). Parsing and formatting live in
// commands.cc and format.cc; this file only dials the admin API, sends the one request
// the command line asked for, and prints. Exit status: 0 ok, 1 the daemon refused or
// could not be reached, 2 usage error, 130 interrupted.
//
// Ctrl-C and SIGTERM are taken by one thread (sigwait) that cancels the call in
// flight, so `watch` ends cleanly instead of dying mid-line; a second one exits at once.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "spgate/v1/admin.grpc.pb.h"
#include "tools/spgatectl/commands.h"
#include "tools/spgatectl/flag_values.h"
#include "tools/spgatectl/format.h"
#include "worker/client/tls.h"

namespace spgate::ctl {
namespace {

// Cancels the call in flight when SIGINT or SIGTERM arrives. The signals are blocked in
// every thread (main blocks them before gRPC starts its own), so only this one sees them.
class Interrupter {
 public:
  explicit Interrupter(sigset_t signals) : signals_(signals) {
    // The thread never returns, so `this` stays reachable until exit.
    std::thread([this] {
      for (int received = 0;; ++received) {
        int sig = 0;
        if (sigwait(&signals_, &sig) != 0) continue;
        if (received > 0) _exit(128 + sig);  // a second Ctrl-C: stop waiting for a clean end
        std::lock_guard<std::mutex> lock(mu_);
        interrupted_ = true;
        if (context_ != nullptr) context_->TryCancel();
      }
    }).detach();
  }

  // The context to cancel; null when no call is in flight.
  void SetContext(grpc::ClientContext* context) {
    std::lock_guard<std::mutex> lock(mu_);
    context_ = context;
    if (interrupted_ && context_ != nullptr) context_->TryCancel();
  }

  bool interrupted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return interrupted_;
  }

 private:
  sigset_t signals_;
  mutable std::mutex mu_;
  bool interrupted_ = false;
  grpc::ClientContext* context_ = nullptr;
};

class Scope {
 public:
  Scope(Interrupter* i, grpc::ClientContext* c) : interrupter_(i) { interrupter_->SetContext(c); }
  ~Scope() { interrupter_->SetContext(nullptr); }

 private:
  Interrupter* interrupter_;
};

absl::StatusOr<std::string> ReadFile(absl::string_view flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": cannot read \"", path, "\""));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

class Client {
 public:
  Client(const Invocation& inv, std::string token, std::shared_ptr<grpc::Channel> channel,
         Interrupter* interrupter)
      : inv_(inv),
        token_(std::move(token)),
        channel_(std::move(channel)),
        stub_(v1::AdminService::NewStub(channel_)),
        interrupter_(interrupter),
        deadline_(absl::Now() + inv.global.timeout) {}

  int Run() {
    const OutputFormat fmt = inv_.global.output;
    switch (inv_.command) {
      case Command::kGatesGet:
        return Unary<v1::VersionedGateConfig>(
            [&](auto* ctx, auto* resp) { return stub_->GetGateConfig(ctx, inv_.gates_get, resp); },
            [&](const auto& resp) { return FormatGateConfig(resp, fmt); });
      case Command::kGatesSet: {
        const JobPresence before = ScopePresence(inv_.gates_set.job_id());
        return Unary<v1::VersionedGateConfig>(
            [&](auto* ctx, auto* resp) {
              return stub_->UpdateGateConfig(ctx, inv_.gates_set, resp);
            },
            [&](const auto& resp) {
              std::cerr << ScopeNote(inv_.gates_set.job_id(), before);
              return FormatGateConfig(resp, fmt);
            });
      }
      case Command::kJobsList:
        return Unary<v1::ListJobsResponse>(
            [&](auto* ctx, auto* resp) { return stub_->ListJobs(ctx, inv_.jobs_list, resp); },
            [&](const auto& resp) {
              if (fmt != OutputFormat::kTable) std::cerr << UnreportedNote(resp);
              return FormatJobList(resp, fmt);
            });
      case Command::kJobsShow:
        return Unary<v1::Job>(
            [&](auto* ctx, auto* resp) { return stub_->GetJob(ctx, inv_.jobs_show, resp); },
            [&](const auto& resp) {
              if (fmt != OutputFormat::kTable) std::cerr << UnreportedNote(resp);
              return FormatJob(resp, fmt, absl::Now());
            });
      case Command::kJobsForget:
        return Unary<v1::ForgetJobResponse>(
            [&](auto* ctx, auto* resp) { return stub_->ForgetJob(ctx, inv_.jobs_forget, resp); },
            [&](const auto& resp) { return FormatForgetJob(inv_.jobs_forget, resp, fmt); });
      case Command::kPin:
        return Unary<v1::Pin>(
            [&](auto* ctx, auto* resp) { return stub_->PinMode(ctx, inv_.pin, resp); },
            [&](const auto& resp) {
              if (!resp.pending()) {
                std::cerr << MemoryGateNote(inv_.name, inv_.pin, LookUpJob(inv_.pin));
              }
              return FormatPin(resp, fmt, absl::Now());
            });
      case Command::kUnpin:
        return Unary<v1::UnpinResponse>(
            [&](auto* ctx, auto* resp) { return stub_->Unpin(ctx, inv_.unpin, resp); },
            [&](const auto& resp) { return FormatUnpin(inv_.unpin, resp, fmt); });
      case Command::kEval:
        return Unary<v1::EvaluateGatesResponse>(
            [&](auto* ctx, auto* resp) { return stub_->EvaluateGates(ctx, inv_.eval, resp); },
            [&](const auto& resp) { return FormatEvaluation(resp, fmt); });
      case Command::kGatesHistory:
        return Unary<v1::ListConfigHistoryResponse>(
            [&](auto* ctx, auto* resp) {
              return stub_->ListConfigHistory(ctx, inv_.gates_history, resp);
            },
            [&](const auto& resp) { return FormatHistory(resp, fmt); });
      case Command::kGatesRollback: {
        const JobPresence before = ScopePresence(inv_.gates_rollback.job_id());
        return Unary<v1::VersionedGateConfig>(
            [&](auto* ctx, auto* resp) {
              return stub_->RollbackGateConfig(ctx, inv_.gates_rollback, resp);
            },
            [&](const auto& resp) {
              std::cerr << ScopeNote(inv_.gates_rollback.job_id(), before);
              return FormatGateConfig(resp, fmt);
            });
      }
      case Command::kWatch:
        return Watch();
      case Command::kHelp:
      case Command::kVersion:
      case Command::kCompletion:
        break;
    }
    return kExitOk;
  }

 private:
  // The command's calls share one --timeout: a job scope's lookup before `gates set` and
  // the call itself end by the same deadline (against an address that never answers, the
  // command waits --timeout, not twice that).
  void Prepare(grpc::ClientContext* ctx, bool deadline) {
    if (deadline) ctx->set_deadline(absl::ToChronoTime(deadline_));
    if (!token_.empty()) ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token_));
  }

  int Fail(const grpc::Status& status) {
    if (interrupter_->interrupted()) {
      std::cerr << "spgatectl: " << inv_.name << ": interrupted\n";
      return kExitInterrupted;
    }
    std::cerr << FormatRpcError(inv_.name, status.error_code(), status.error_message())
              << HandshakeHint(status.error_code(), status.error_message(),
                               client::TlsClientOptions{.ca = inv_.global.tls_ca,
                                                        .cert = inv_.global.tls_cert}
                                   .enabled());
    return kExitRpcError;
  }

  template <typename Response, typename Call, typename Format>
  int Unary(Call call, Format format) {
    grpc::ClientContext ctx;
    Prepare(&ctx, /*deadline=*/true);
    Response response;
    grpc::Status status;
    {
      Scope scope(interrupter_, &ctx);
      status = call(&ctx, &response);
    }
    if (!status.ok()) return Fail(status);
    std::cout << format(response) << std::flush;
    return kExitOk;
  }

  // Waits up to --timeout for the channel to connect. A channel that fails to connect is
  // left to the call, whose UNAVAILABLE carries gRPC's reason; one that is still
  // connecting when the time is up is reported here.
  bool Connect() {
    const absl::Time deadline = absl::Now() + inv_.global.timeout;
    for (;;) {
      const grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/true);
      if (state == GRPC_CHANNEL_READY || state == GRPC_CHANNEL_TRANSIENT_FAILURE ||
          state == GRPC_CHANNEL_SHUTDOWN || interrupter_->interrupted()) {
        return true;
      }
      const absl::Time now = absl::Now();
      if (now >= deadline) return false;
      // Short slices, so that Ctrl-C is noticed while connecting.
      channel_->WaitForStateChange(state,
                                   absl::ToChronoTime(std::min(deadline, now + absl::Milliseconds(100))));
    }
  }

  // Where the daemon stands with `job` (GetJob): NOT_FOUND is kUnknown, a job listed with
  // no launch's incarnation (its operator settings alone) kNoLaunch; another error kUnsure.
  JobPresence Presence(const std::string& job) {
    grpc::ClientContext ctx;
    Prepare(&ctx, /*deadline=*/true);
    v1::GetJobRequest request;
    request.set_job_id(job);
    v1::Job found;
    grpc::Status status;
    {
      Scope scope(interrupter_, &ctx);
      status = stub_->GetJob(&ctx, request, &found);
    }
    if (status.error_code() == grpc::StatusCode::NOT_FOUND) return JobPresence::kUnknown;
    if (!status.ok()) return JobPresence::kUnsure;
    return found.summary().incarnation().empty() ? JobPresence::kNoLaunch
                                                 : JobPresence::kRunning;
  }

  // After an unforced TP-only pin, the job as GetJob shows it: whether the memory gate
  // holds its groups in SP, which the pin's answer cannot say (MemoryGateNote). Empty
  // for any other pin, and when the lookup fails: the pin stands, the note is a hint.
  v1::Job LookUpJob(const v1::PinModeRequest& pin) {
    v1::Job found;
    if (pin.mode() != v1::TENSOR_PARALLEL_ONLY || pin.force()) return found;
    grpc::ClientContext ctx;
    Prepare(&ctx, /*deadline=*/true);
    v1::GetJobRequest request;
    request.set_job_id(pin.job_id());
    grpc::Status status;
    {
      Scope scope(interrupter_, &ctx);
      status = stub_->GetJob(&ctx, request, &found);
    }
    if (!status.ok()) found.Clear();
    return found;
  }

  // gates set and gates rollback of a job scope: a scope is kept for any job id (a job
  // about to start), a typo too. The job is looked up before the call, since the call's
  // overrides list it; ScopeNote says, once the call succeeded, that no launch of it runs.
  JobPresence ScopePresence(const std::string& job) {
    return job.empty() ? JobPresence::kRunning : Presence(job);
  }
  std::string ScopeNote(const std::string& job, JobPresence before) {
    return JobPresenceNote(inv_.name, job, before,
                           inv_.command == Command::kGatesRollback
                               ? "the config shown applies from its first decision"
                               : "its scope is kept and applies from its first decision");
  }

  int Watch() {
    if (!Connect()) {
      std::cerr << FormatRpcError(inv_.name, grpc::StatusCode::DEADLINE_EXCEEDED,
                                  absl::StrCat("could not connect to ", inv_.global.admin,
                                               " within ", absl::FormatDuration(inv_.global.timeout)));
      return kExitRpcError;
    }
    // A job the daemon does not know yet (one about to start, or a typo): the stream
    // waits for its first decision; say so, rather than wait in silence.
    if (const std::string& job = inv_.watch.job_id(); !job.empty()) {
      std::cerr << JobPresenceNote(inv_.name, job, Presence(job), "waiting for its first decision");
    }
    grpc::ClientContext ctx;
    Prepare(&ctx, /*deadline=*/false);  // a watch runs until --count or a signal
    Scope scope(interrupter_, &ctx);
    std::unique_ptr<grpc::ClientReader<v1::Decision>> reader =
        stub_->WatchDecisions(&ctx, inv_.watch);
    v1::Decision decision;
    int64_t seen = 0;
    bool enough = false;
    while (reader->Read(&decision)) {
      std::cout << FormatDecisionLine(decision, inv_.global.output) << std::flush;
      if (inv_.watch_count > 0 && ++seen >= inv_.watch_count) {
        enough = true;
        ctx.TryCancel();
        while (reader->Read(&decision)) {
        }
        break;
      }
    }
    const grpc::Status status = reader->Finish();
    if (enough || interrupter_->interrupted()) return kExitOk;
    if (!status.ok()) return Fail(status);
    return kExitOk;
  }

  const Invocation& inv_;
  const std::string token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::AdminService::Stub> stub_;
  Interrupter* interrupter_;
  const absl::Time deadline_;  // of every unary call (Prepare)
};

int UsageError(const Invocation& inv, absl::string_view message) {
  const std::string prefix = inv.name.empty() ? "" : absl::StrCat(inv.name, ": ");
  std::cerr << "spgatectl: " << prefix << message << "\n"
            << "run 'spgatectl " << (inv.name.empty() ? "" : absl::StrCat(inv.name, " "))
            << "--help' for usage\n";
  return kExitUsage;
}

int Main(int argc, char** argv, Interrupter* interrupter) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  Invocation inv;
  if (absl::Status s = ParseCommandLine(args, ProcessEnv, &inv); !s.ok()) {
    return UsageError(inv, s.message());
  }
  if (inv.command == Command::kHelp || inv.command == Command::kVersion ||
      inv.command == Command::kCompletion) {
    std::cout << inv.help;
    return kExitOk;
  }
  const GlobalOptions& g = inv.global;

  std::string token;
  if (!g.token_file.empty()) {
    absl::StatusOr<std::string> t = ReadFile("token_file", g.token_file);
    if (!t.ok()) return UsageError(inv, t.status().message());
    absl::StatusOr<std::string> parsed = TokenFromFileText(g.token_file, *t);
    if (!parsed.ok()) return UsageError(inv, parsed.status().message());
    token = *std::move(parsed);
  }

  const client::TlsClientOptions tls{
      .ca = g.tls_ca, .cert = g.tls_cert, .key = g.tls_key, .server_name = g.tls_server_name};
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      client::TlsChannelCredentials(tls, client::kTlsFlagNames);
  if (!creds.ok()) return UsageError(inv, creds.status().message());
  grpc::ChannelArguments channel_args;
  if (!tls.server_name.empty()) channel_args.SetSslTargetNameOverride(tls.server_name);
  Client client(inv, token, grpc::CreateCustomChannel(g.admin, *creds, channel_args), interrupter);
  return client.Run();
}

}  // namespace
}  // namespace spgate::ctl

int main(int argc, char** argv) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // Never deleted: its thread waits in sigwait until the process exits.
  auto* interrupter = new spgate::ctl::Interrupter(signals);
  return spgate::ctl::Main(argc, argv, interrupter);
}
