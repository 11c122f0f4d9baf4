// The one background thread that every GateClient in a process shares: it runs timers
// (heartbeats, telemetry flushes, reconnect backoff) and write kicks, so a process with
// 1,024 clients (spgate-sim) still has one spgate thread plus gRPC's own pool. Stream I/O
// itself runs on gRPC's callback threads.
//
// Tasks must be short and must not block: they start gRPC operations and return.
// Internal to worker/client.
#ifndef SPGATE_WORKER_CLIENT_CLIENT_RUNTIME_H_
#define SPGATE_WORKER_CLIENT_CLIENT_RUNTIME_H_

#include <cstdint>
#include <memory>
#include <thread>

#include "absl/functional/any_invocable.h"
#include "absl/time/time.h"

namespace spgate::client::internal {

class ClientRuntime {
 public:
  using Task = absl::AnyInvocable<void() &&>;

  // The process-wide runtime; its thread lives while someone holds the pointer.
  static std::shared_ptr<ClientRuntime> Get();

  ClientRuntime();
  ~ClientRuntime();
  ClientRuntime(const ClientRuntime&) = delete;
  ClientRuntime& operator=(const ClientRuntime&) = delete;

  // Runs `task` on the runtime thread as soon as possible / at `when`. Wakes the thread
  // (a futex syscall) when it would otherwise sleep past `when`.
  void RunAt(absl::Time when, Task task);

  // Runs `task` on the runtime thread within kPollInterval. This is the training thread's
  // path (a plan or telemetry to write): while tasks keep coming the runtime thread polls
  // every kPollInterval, so deferring costs a lock and a push — no syscall, no context
  // switch on the caller's core. After kPollLinger without deferred work the thread
  // sleeps until its next timer, and the next Defer wakes it once.
  void Defer(Task task);
  static constexpr absl::Duration kPollInterval = absl::Microseconds(500);
  static constexpr absl::Duration kPollLinger = absl::Seconds(2);

 private:
  struct State;
  static void Loop(std::shared_ptr<State> state);

  // Owned jointly with the thread: if the last reference to the runtime is dropped by a
  // task on the runtime thread itself, the thread is detached and finishes on its own.
  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace spgate::client::internal

#endif  // SPGATE_WORKER_CLIENT_CLIENT_RUNTIME_H_
