// A scriptable in-process GateService for the client's protocol tests: it can answer
// plans (SP, or any mode and reason it is told, even ones the real daemon's memory gate
// would never give), stay silent (a "black hole" daemon), reject plans or every Register,
// forget sessions, replace them (the stream ends ABORTED, as when another process
// registered as the same rank), and it records what the client sent. The real daemon is
// exercised in gate_client_test.cc.
#ifndef SPGATE_TESTS_WORKER_FAKE_GATE_SERVICE_H_
#define SPGATE_TESTS_WORKER_FAKE_GATE_SERVICE_H_

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "grpcpp/grpcpp.h"
#include "proto/convert.h"
#include "spgate/v1/gate.grpc.pb.h"

namespace spgate::client::testing {

class FakeGateService final : public v1::GateService::CallbackService {
 public:
  struct Script {
    bool answer_plans = true;     // false: read and say nothing (black hole)
    bool reject_plans = false;    // answer every plan with a PlanRejection
    // What an answer says.
    v1::Mode answer_mode = v1::SEQUENCE_PARALLEL;
    v1::Reason answer_reason = v1::GATES_PASSED;
    bool answer_pin_forced = false;
    int reject_code = 3;          // ... with this code (3: INVALID_ARGUMENT)
    bool ack_heartbeats = true;
    // Answers every ack_every-th heartbeat, naming it (Heartbeat.seq): the acks of the
    // ones between merged into it, as the daemon merges acks queued behind a write.
    int ack_every = 1;
    int64_t decision_config_version = 42;
    double max_length_cv = 0.18;  // served config
    int64_t heartbeat_ms = 100;
    // Non-zero: every Register is refused with this gRPC code and message.
    int register_code = 0;
    std::string register_message;
  };

  void set_script(const Script& s) {
    spgate::MutexLock l(&mu_);
    script_ = s;
  }
  // Sessions issued so far are forgotten: their next Connect ends with NOT_FOUND.
  void ForgetSessions() {
    spgate::MutexLock l(&mu_);
    valid_.clear();
  }
  // Ends every open stream with UNAVAILABLE (a daemon restart, as the client sees it).
  void KillStreams() {
    spgate::MutexLock l(&mu_);
    for (Stream* st : streams_) st->FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE, "bye"));
  }
  // Ends every open stream with ABORTED "session replaced", as the daemon does when the
  // rank registers again from another process (its sessions stay known).
  void ReplaceSessions() {
    spgate::MutexLock l(&mu_);
    for (Stream* st : streams_) {
      st->FinishOnce(grpc::Status(grpc::StatusCode::ABORTED,
                                  "session replaced: the rank registered again"));
    }
  }
  int registrations() const {
    spgate::MutexLock l(&mu_);
    return registrations_;
  }
  // The launch_credential of every Register, in order.
  std::vector<std::string> launch_credentials() const {
    spgate::MutexLock l(&mu_);
    return credentials_;
  }
  // The hardware_id of every Register, in order.
  std::vector<std::string> hardware_ids() const {
    spgate::MutexLock l(&mu_);
    return hardware_ids_;
  }
  int open_streams() const {
    spgate::MutexLock l(&mu_);
    return static_cast<int>(streams_.size());
  }
  // Heartbeat.memory_overrides of the last heartbeat (-1: no heartbeat yet).
  int64_t last_memory_overrides() const {
    spgate::MutexLock l(&mu_);
    return last_memory_overrides_;
  }
  int64_t plans_seen() const {
    spgate::MutexLock l(&mu_);
    return plans_seen_;
  }
  int64_t telemetry_seen() const {
    spgate::MutexLock l(&mu_);
    return telemetry_seen_;
  }
  // Local-decision counts of the last heartbeat, by reason.
  std::map<int, int64_t> last_local_decisions() const {
    spgate::MutexLock l(&mu_);
    return last_local_;
  }

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const v1::RegisterRequest* req,
                                     v1::RegisterResponse* resp) override {
    spgate::MutexLock l(&mu_);
    credentials_.push_back(req->launch_credential());
    hardware_ids_.push_back(req->hardware_id());
    if (script_.register_code != 0) {
      auto* r = ctx->DefaultReactor();
      r->Finish(grpc::Status(static_cast<grpc::StatusCode>(script_.register_code),
                             script_.register_message));
      return r;
    }
    const std::string id = absl::StrCat("s", ++registrations_);
    valid_.insert(id);
    resp->set_session_id(id);
    GateConfig c;
    c.max_length_cv = script_.max_length_cv;
    *resp->mutable_config()->mutable_config() = ToProto(c);
    resp->mutable_config()->set_effective_version(script_.decision_config_version);
    resp->set_effective_from_step(0);
    resp->mutable_heartbeat_interval()->set_nanos(
        static_cast<int32_t>(script_.heartbeat_ms * 1'000'000));
    resp->set_last_decided_step(-1);
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }

  grpc::ServerBidiReactor<v1::WorkerMessage, v1::DaemonMessage>* Connect(
      grpc::CallbackServerContext* ctx) override {
    return new Stream(this);
  }

 private:
  class Stream final : public grpc::ServerBidiReactor<v1::WorkerMessage, v1::DaemonMessage> {
   public:
    explicit Stream(FakeGateService* svc) : svc_(svc) {
      {
        spgate::MutexLock l(&svc_->mu_);
        svc_->streams_.insert(this);
      }
      StartRead(&in_);
    }
    void OnReadDone(bool ok) override {
      if (!ok) {
        FinishOnce(grpc::Status::OK);
        return;
      }
      v1::DaemonMessage out;
      bool send = false;
      if (!attached_) {
        bool known;
        {
          spgate::MutexLock l(&svc_->mu_);
          known = svc_->valid_.contains(in_.session_id());
        }
        if (!known) {
          FinishOnce(grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown session"));
          return;
        }
        attached_ = true;
      }
      {
        spgate::MutexLock l(&svc_->mu_);
        const Script& s = svc_->script_;
        for (const v1::BatchPlan& p : in_.plans()) {
          ++svc_->plans_seen_;
          if (s.reject_plans) {
            auto* rej = out.add_rejections();
            rej->set_step(p.step());
            rej->set_code(s.reject_code);
            rej->set_message(s.reject_code == 8 ? "plan: more than 1000 plans a second "
                                                  "(--max_plans_per_second)"
                                                : "lengths: rejected by the fake");
            send = true;
          } else if (s.answer_plans) {
            v1::Decision* d = out.add_decisions();
            d->set_job_id(p.job_id());
            d->set_group(p.group());
            d->set_step(p.step());
            d->set_mode(s.answer_mode);
            d->set_reason(s.answer_reason);
            d->set_pin_forced(s.answer_pin_forced);
            d->set_config_version(s.decision_config_version);
            send = true;
          }
        }
        received_ += in_.telemetry_size();
        svc_->telemetry_seen_ += in_.telemetry_size();
        if (in_.has_heartbeat()) {
          svc_->last_local_.clear();
          for (const auto& c : in_.heartbeat().local_decisions()) {
            svc_->last_local_[c.reason()] = c.count();
          }
          svc_->last_memory_overrides_ = in_.heartbeat().memory_overrides();
          if (s.ack_heartbeats && ++heartbeats_ % std::max(s.ack_every, 1) == 0) {
            out.mutable_ack()->set_telemetry_received(received_);
            out.mutable_ack()->set_heartbeat_seq(in_.heartbeat().seq());
            send = true;
          }
        }
      }
      if (send) Send(std::move(out));
      StartRead(&in_);
    }
    void OnWriteDone(bool ok) override {
      spgate::MutexLock l(&mu_);
      writing_ = false;
      if (ok && !queue_.empty() && !finish_requested_) {
        current_ = std::move(queue_.front());
        queue_.pop_front();
        writing_ = true;
        StartWrite(&current_);
      } else if (finish_requested_ && !finished_) {
        finished_ = true;
        Finish(finish_status_);
      }
    }
    void OnDone() override {
      {
        spgate::MutexLock l(&svc_->mu_);
        svc_->streams_.erase(this);
      }
      delete this;
    }
    void Send(v1::DaemonMessage m) {
      spgate::MutexLock l(&mu_);
      if (finish_requested_) return;
      if (writing_) {
        queue_.push_back(std::move(m));
        return;
      }
      current_ = std::move(m);
      writing_ = true;
      StartWrite(&current_);
    }
   private:
    friend class FakeGateService;
    // Finish only once no write is in flight (OnWriteDone finishes otherwise).
    void FinishOnce(grpc::Status s) {
      spgate::MutexLock l(&mu_);
      if (finish_requested_) return;
      finish_requested_ = true;
      finish_status_ = std::move(s);
      if (!writing_) {
        finished_ = true;
        Finish(finish_status_);
      }
    }
    FakeGateService* svc_;
    v1::WorkerMessage in_;
    bool attached_ = false;
    int64_t received_ = 0;
    int64_t heartbeats_ = 0;  // heartbeats read on this stream
    spgate::Mutex mu_;
    bool writing_ = false;
    bool finish_requested_ = false;
    bool finished_ = false;
    grpc::Status finish_status_;
    v1::DaemonMessage current_;
    std::deque<v1::DaemonMessage> queue_;
  };

  mutable spgate::Mutex mu_;
  Script script_;
  std::set<std::string> valid_;
  std::set<Stream*> streams_;
  int registrations_ = 0;
  std::vector<std::string> credentials_;
  std::vector<std::string> hardware_ids_;
  int64_t last_memory_overrides_ = -1;
  int64_t plans_seen_ = 0;
  int64_t telemetry_seen_ = 0;
  std::map<int, int64_t> last_local_;
};

// The fake on 127.0.0.1:0.
class FakeGateServer {
 public:
  FakeGateServer() {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(&service_);
    server_ = b.BuildAndStart();
  }
  ~FakeGateServer() { server_->Shutdown(std::chrono::system_clock::now()); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  FakeGateService& service() { return service_; }

 private:
  FakeGateService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace spgate::client::testing

#endif  // SPGATE_TESTS_WORKER_FAKE_GATE_SERVICE_H_
