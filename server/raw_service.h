// A gRPC service whose methods parse their own requests (docs/design.md §6, "Requests
// that do not parse"). Every method is registered as a bidirectional stream of raw
// bytes, so that
//  - a request that does not parse (garbage, invalid UTF-8 in a string field) is
//    INVALID_ARGUMENT naming the message type; gRPC's typed handlers answer such a call
//    UNIMPLEMENTED with no message, which a client author reads as "no such method";
//  - a unary call that sends its headers and never its request is ended after
//    `first_message_timeout` (DEADLINE_EXCEEDED); a typed unary handler only starts once
//    the request is there, so such a call would be held until its connection closes.
// The wire is unchanged: a unary method reads one request, answers once and finishes,
// so every gRPC client calls it as the unary RPC it is. The methods' names are the
// proto service's, so server reflection lists the service as usual.
//
// Invariant: one Finish per call. A call's reactor finishes from exactly one of its read
// completion, its cancellation or the sweeper's timeout (an atomic claim decides).
//
// Usage (in a service's constructor):
//   AddUnary<v1::GetJobRequest, v1::Job>("GetJob",
//       [this](grpc::CallbackServerContext* ctx, const v1::GetJobRequest& r) { ... });
//   AddStream("Connect", [this](grpc::CallbackServerContext* ctx) { return new R(...); });
#ifndef SPGATE_SERVER_RAW_SERVICE_H_
#define SPGATE_SERVER_RAW_SERVICE_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/service_type.h"
#include "grpcpp/impl/codegen/server_callback_handlers.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"
#include "proto/grpc_status.h"

namespace spgate::server {

using RawReactor = grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>;

// See SyncWithFinishedCallbacks. Declared first thing in a callback, so its release
// comes after everything the callback did.
#if defined(__SANITIZE_THREAD__)
extern std::atomic<uint64_t> callbacks_finished;
class CallbackScope {
 public:
  ~CallbackScope() { callbacks_finished.fetch_add(1, std::memory_order_release); }
};
#else
class CallbackScope {};
#endif

// Call after every server's Shutdown has returned, before freeing what the services use.
// Shutdown returns only once every callback has returned, but it learns that through
// gRPC's uninstrumented queues, so ThreadSanitizer would see the daemon freeing its
// state (Metrics, the services) as racing with the last callbacks. Under TSan every
// reactor callback and constructor ends with a release on one counter, and this
// acquires it; without TSan it compiles to nothing.
void SyncWithFinishedCallbacks();

// gRPC hands a reactor from the thread that built it to the threads that run its
// callbacks through its own queues, which ThreadSanitizer cannot see (Debian's gRPC is
// not instrumented). This release/acquire pair makes the hand-off visible; it costs one
// uncontended atomic load per callback.
class PublishedReactor {
 protected:
  void Publish() { published_.store(true, std::memory_order_release); }
  void Acquire() const { (void)published_.load(std::memory_order_acquire); }

 private:
  std::atomic<bool> published_{false};
};

// `message` from the call's bytes; false when they do not parse as that type.
template <typename Message>
bool ParseMessage(grpc::ByteBuffer* bytes, Message* message) {
  message->Clear();
  return grpc::SerializationTraits<Message>::Deserialize(bytes, message).ok();
}

// `message` as the bytes of one write.
template <typename Message>
void SerializeMessage(const Message& message, grpc::ByteBuffer* bytes) {
  bytes->Clear();  // a writer's buffer is reused; the serializer wants an empty one
  bool own_buffer = false;
  (void)grpc::SerializationTraits<Message>::Serialize(message, bytes, &own_buffer);
}

// "spgate.v1.RegisterRequest: the request does not parse (...)" for a message type.
std::string UnparseableMessage(absl::string_view type_name);

// The unary calls whose request has not arrived yet, for the sweeper to end.
class PendingCalls {
 public:
  class Call {
   public:
    virtual ~Call() = default;
    // Ends the call (DEADLINE_EXCEEDED) when it opened before `cutoff` and its request
    // has not arrived; true when it did. Must not block.
    virtual bool ExpireIfSilentSince(absl::Time cutoff) = 0;
  };
  void Add(Call* call);
  void Remove(Call* call);
  // Ends the calls opened before `cutoff` still waiting for their request; how many.
  int ExpireSilent(absl::Time cutoff);
  int size();

 private:
  Mutex mu_;
  absl::flat_hash_set<Call*> calls_ ABSL_GUARDED_BY(mu_);
};

// One unary call over the raw stream: read the request, run the handler, write the
// answer and finish.
template <typename Request, typename Response>
class UnaryCall final : public RawReactor, public PendingCalls::Call, private PublishedReactor {
 public:
  using Handler = std::function<absl::StatusOr<Response>(grpc::CallbackServerContext*,
                                                         const Request&)>;

  UnaryCall(grpc::CallbackServerContext* ctx, const Handler* handler, PendingCalls* pending)
      : ctx_(ctx), handler_(handler), pending_(pending) {
    [[maybe_unused]] CallbackScope scope;
    Publish();
    pending_->Add(this);
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    [[maybe_unused]] CallbackScope scope;
    Acquire();
    if (!Claim()) return;  // the sweeper or a cancellation finished it
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat(Request::descriptor()->full_name(),
                                       ": the call ended without its request message")));
      return;
    }
    Request request;
    if (!ParseMessage(&in_, &request)) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          UnparseableMessage(Request::descriptor()->full_name())));
      return;
    }
    absl::StatusOr<Response> response = (*handler_)(ctx_, request);
    if (!response.ok()) {
      Finish(ToGrpcStatus(response.status()));
      return;
    }
    SerializeMessage(*response, &out_);
    StartWriteAndFinish(&out_, grpc::WriteOptions(), grpc::Status::OK);
  }

  void OnCancel() override {
    [[maybe_unused]] CallbackScope scope;
    Acquire();
    if (Claim()) Finish(grpc::Status::CANCELLED);
  }

  bool ExpireIfSilentSince(absl::Time cutoff) override {
    Acquire();
    if (opened_ >= cutoff || !Claim()) return false;
    Finish(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        absl::StrCat("no ", Request::descriptor()->full_name(),
                                     " arrived within --first_message_timeout of the call's "
                                     "start")));
    return true;
  }

  void OnDone() override {
    [[maybe_unused]] CallbackScope scope;
    Acquire();
    pending_->Remove(this);
    delete this;
  }

 private:
  bool Claim() { return !claimed_.exchange(true, std::memory_order_acq_rel); }

  grpc::CallbackServerContext* const ctx_;
  const Handler* const handler_;
  PendingCalls* const pending_;
  const absl::Time opened_ = absl::Now();
  std::atomic<bool> claimed_{false};
  grpc::ByteBuffer in_, out_;
};

// A grpc::Service of raw-stream methods named after the proto service `full_name`
// ("spgate.v1.GateService").
class RawService : public grpc::Service {
 public:
  // The methods registered, by name ("Register"), in registration order.
  const std::vector<std::string>& method_names() const { return method_names_; }

 protected:
  RawService(absl::string_view full_name, PendingCalls* pending)
      : full_name_(full_name), pending_(pending) {}

  template <typename Request, typename Response, typename Fn>
  void AddUnary(absl::string_view method, Fn fn) {
    using Call = UnaryCall<Request, Response>;
    // Owned by the method's handler, which the service owns: it outlives every call.
    auto handler = std::make_shared<typename Call::Handler>(std::move(fn));
    PendingCalls* pending = pending_;
    AddStream(method, [handler, pending](grpc::CallbackServerContext* ctx) -> RawReactor* {
      return new Call(ctx, handler.get(), pending);
    });
  }

  void AddStream(absl::string_view method,
                 std::function<RawReactor*(grpc::CallbackServerContext*)> create);

 private:
  const std::string full_name_;
  PendingCalls* const pending_;
  std::deque<std::string> paths_;  // "/spgate.v1.GateService/Register"; stable addresses
  std::vector<std::string> method_names_;
};

}  // namespace spgate::server

#endif  // SPGATE_SERVER_RAW_SERVICE_H_
