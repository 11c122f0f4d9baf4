// Raw-stream methods that parse their own requests; see raw_service.h.
#include "server/raw_service.h"

#include <utility>

namespace spgate::server {

#if defined(__SANITIZE_THREAD__)
std::atomic<uint64_t> callbacks_finished{0};
#endif

void SyncWithFinishedCallbacks() {
#if defined(__SANITIZE_THREAD__)
  (void)callbacks_finished.load(std::memory_order_acquire);
#endif
}

std::string UnparseableMessage(absl::string_view type_name) {
  return absl::StrCat(type_name,
                      ": the request does not parse (not this message in protobuf's binary "
                      "format, or a string field that is not valid UTF-8)");
}

void PendingCalls::Add(Call* call) {
  MutexLock lock(&mu_);
  calls_.insert(call);
}

void PendingCalls::Remove(Call* call) {
  MutexLock lock(&mu_);
  calls_.erase(call);
}

int PendingCalls::ExpireSilent(absl::Time cutoff) {
  // Expiring only requests a Finish; OnDone (which calls Remove) runs later on a gRPC
  // thread, so holding the lock here cannot deadlock.
  MutexLock lock(&mu_);
  int expired = 0;
  for (Call* call : calls_) expired += call->ExpireIfSilentSince(cutoff) ? 1 : 0;
  return expired;
}

int PendingCalls::size() {
  MutexLock lock(&mu_);
  return static_cast<int>(calls_.size());
}

void RawService::AddStream(absl::string_view method,
                           std::function<RawReactor*(grpc::CallbackServerContext*)> create) {
  paths_.push_back(absl::StrCat("/", full_name_, "/", method));
  method_names_.emplace_back(method);
  // A bidirectional stream to gRPC: the reactor starts when the call's headers arrive,
  // before any request, and reads the request itself.
  AddMethod(new grpc::internal::RpcServiceMethod(
      paths_.back().c_str(), grpc::internal::RpcMethod::BIDI_STREAMING, nullptr));
  MarkMethodRawCallback(
      static_cast<int>(method_names_.size()) - 1,
      new grpc::internal::CallbackBidiHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
          std::move(create)));
}

}  // namespace spgate::server
