// The client's side of the wire: the gRPC channel it dials and the messages it builds
// and reads (spgate.v1). GateClient gathers what to send under its lock into Outgoing
// and serialises it here, outside the lock; nothing here holds state.
//
// Usage:
//   std::shared_ptr<grpc::Channel> ch = CreateGateChannel(options);  // channel.h
//   v1::RegisterRequest req = BuildRegisterRequest(options);
//   BuildWorkerMessage(options, outgoing, &reactor->out);
#ifndef SPGATE_WORKER_CLIENT_WIRE_H_
#define SPGATE_WORKER_CLIENT_WIRE_H_

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "spgate/v1/gate.pb.h"
#include "worker/client/client_options.h"
#include "worker/client/client_types.h"
#include "worker/client/decision_book.h"

namespace spgate::client {

// A heartbeat's counters: the local policy's decisions by reason and the memory gate's
// overrides, cumulative over the worker process (DecisionBook's counters).
struct HeartbeatCounts {
  std::array<int64_t, kNumReasons> local_decisions{};
  int64_t memory_overrides = 0;
};

// What one WorkerMessage carries, gathered under the client's lock.
struct Outgoing {
  std::string session_id;  // first message of a stream only
  // The book's records, taken over (not copied) under the lock; read-only from here on,
  // and let go of under the lock again (the book recycles them: decision_book.h).
  std::vector<std::shared_ptr<const PlanRecord>> plans;
  std::vector<StepTelemetryInput> telemetry;
  bool heartbeat = false;
  // Since what an earlier session's daemon acknowledged (GateClient's reported base):
  // cumulative over this session, as the daemon counts them.
  HeartbeatCounts counts;
  int64_t heartbeat_seq = 0;  // this stream's heartbeat count, from 1 (Heartbeat.seq)
  int64_t telemetry_sent = 0;
  bool empty() const {
    return session_id.empty() && plans.empty() && telemetry.empty() && !heartbeat;
  }
};

v1::RegisterRequest BuildRegisterRequest(const GateClientOptions& options);
void BuildWorkerMessage(const GateClientOptions& options, const Outgoing& out,
                        v1::WorkerMessage* msg);
// A daemon decision as the client's decision book keeps it: a step plan's one decision per
// micro-batch, a plain plan's one in mode and reason (no list: decision_book.cc,
// AnswerDecisions); nullopt for an unknown mode or reason.
std::optional<GateDecision> DecisionFromProto(const v1::Decision& d);

}  // namespace spgate::client

#endif  // SPGATE_WORKER_CLIENT_WIRE_H_
