// spgate.GroupDecider: the binding of client::GroupDecider (worker/client/group_decider.h)
// over Python collectives - a broadcast of the leader's decision and, for the leader's
// group session, a max-reduce of the group's telemetry - and wire_failure for tests and
// custom broadcasts.
//
// Invariant: decide, decide_microbatches and report_telemetry release the GIL; the
// broadcast and reduce callbacks take it back only to run the Python callable.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "python/bindings.h"
#include "worker/client/gate_client.h"
#include "worker/client/group_decider.h"

namespace spgate::python {
namespace {

// Runs a Python collective on `bytes`: callable(buf: bytearray, root), which must leave
// buf the same size; its contents are copied back. With the GIL (taken here). A Python
// exception becomes INTERNAL with the exception's text.
absl::Status CallWithBytes(const py::object& fn, const char* what, std::span<uint8_t> bytes,
                           int root) {
  py::gil_scoped_acquire gil;
  try {
    py::bytearray buf(reinterpret_cast<const char*>(bytes.data()),
                      static_cast<Py_ssize_t>(bytes.size()));
    fn(buf, root);
    const Py_ssize_t n = PyByteArray_Size(buf.ptr());
    if (n != static_cast<Py_ssize_t>(bytes.size())) {
      return absl::InternalError(
          absl::StrCat(what, " left ", n, " bytes in the ", bytes.size(), "-byte buffer"));
    }
    std::memcpy(bytes.data(), PyByteArray_AsString(buf.ptr()), bytes.size());
    return absl::OkStatus();
  } catch (py::error_already_set& e) {
    return absl::InternalError(absl::StrCat(what, " failed: ", e.what()));
  }
}

// C++ GroupDecider over a Python broadcast: broadcast(buf: bytearray, root) fills buf
// with the root's bytes on the other ranks (24 bytes, and one more per micro-batch of a
// step plan); and, for the leader's group session, a Python max-reduce: reduce(buf:
// bytearray of little-endian float64s: 16, 8 more per micro-batch of a step plan, and
// the ranks' busy times, group_size and, within 4,096 in all, group_size per micro-batch;
// root) leaves the element-wise maximum over the group in the root's buf. `group_size`
// (0: the client's) is needed by a follower without a Client that reduces. A Python
// exception in either becomes INTERNAL with the exception's text.
class Decider {
 public:
  Decider(Client* client, int rank_in_group, py::object broadcast, py::object reduce,
          int group_size)
      : client_(client), broadcast_(std::move(broadcast)), reduce_(std::move(reduce)) {
    if (!PyCallable_Check(broadcast_.ptr())) {
      Raise(absl::InvalidArgumentError("broadcast must be callable(buf, root)"));
    }
    if (!reduce_.is_none() && !PyCallable_Check(reduce_.ptr())) {
      Raise(absl::InvalidArgumentError("reduce must be None or callable(buf, root)"));
    }
    if (rank_in_group == 0 && (client == nullptr || client->closed())) {
      Raise(absl::InvalidArgumentError("client: the group leader (rank 0) needs an open Client"));
    }
    if (client != nullptr && client->closed()) {
      Raise(absl::InvalidArgumentError("client: the Client is closed"));
    }
    auto broadcast_fn = [this](std::span<uint8_t> bytes, int root) {
      return CallWithBytes(broadcast_, "broadcast", bytes, root);
    };
    client::MaxReduceFn reduce_fn;  // empty: each rank reports through its own client
    if (!reduce_.is_none()) {
      reduce_fn = [this](std::span<double> values, int root) {
        return CallWithBytes(reduce_, "reduce",
                             std::span<uint8_t>(reinterpret_cast<uint8_t*>(values.data()),
                                                values.size_bytes()),
                             root);
      };
    }
    // This rank's checks alone (no collective): spgate.torch.GroupDecider agrees on every
    // rank's outcome with an all-reduce of its own, its leader's decider made before it.
    // The decider keeps the GateClient's address; every call below that can reach it
    // holds the client (Client::Get) while it runs, and raises once it is closed.
    std::shared_ptr<GateClient> held = client != nullptr ? client->Get("GroupDecider") : nullptr;
    auto d = client::GroupDecider::CreateLocal(held.get(), rank_in_group,
                                               std::move(broadcast_fn), std::move(reduce_fn),
                                               group_size);
    Check(d.status());
    decider_ = std::move(*d);
  }

  bool is_leader() const { return decider_->is_leader(); }

  void SubmitPlan(const BatchPlan& plan) {
    if (!is_leader()) return;
    std::shared_ptr<GateClient> held = client_->Get("submit_plan");
    std::vector<client::MicrobatchPlanInput> mbs;
    Check(decider_->SubmitPlan(plan.Input(mbs)));
  }

  // Collective: the step's decision, and a step plan's per micro-batch (microbatches > 0).
  GateDecision Decide(int64_t step, int microbatches, std::optional<double> timeout) {
    absl::Time deadline = absl::InfiniteFuture();
    std::shared_ptr<GateClient> held;  // the leader's, until the broadcast is done
    if (is_leader()) {
      held = client_->Get(microbatches > 0 ? "decide_microbatches" : "decide");
      deadline = absl::Now() + (timeout ? Seconds(*timeout, "timeout")
                                        : held->options().decision_deadline);
    }
    absl::StatusOr<GateDecision> d;
    {
      py::gil_scoped_release release;
      d = decider_->Decide(step, microbatches, deadline);
    }
    Check(d.status());
    return *d;
  }

  // Collective with a reduce (every rank, every step it reports); else the rank's own
  // client's ReportTelemetry.
  void ReportTelemetry(const client::StepTelemetryInput& t) {
    std::shared_ptr<GateClient> held;  // not closed, and not while this runs
    if (client_ != nullptr) held = client_->Get("report_telemetry");
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = decider_->ReportTelemetry(t);
    }
    Check(s);
  }

 private:
  Client* client_;
  py::object broadcast_;
  py::object reduce_;
  std::unique_ptr<client::GroupDecider> decider_;
};

}  // namespace

void BindGroupDecider(py::module_& m) {
  py::class_<Decider>(m, "GroupDecider")
      .def(py::init([](py::object client, int rank_in_group, py::object broadcast,
                       py::object reduce, int group_size) {
             Client* c = client.is_none() ? nullptr : client.cast<Client*>();
             return std::make_unique<Decider>(c, rank_in_group, std::move(broadcast),
                                              std::move(reduce), group_size);
           }),
           py::arg("client"), py::arg("rank_in_group"), py::arg("broadcast"),
           py::arg("reduce") = py::none(), py::kw_only(), py::arg("group_size") = 0,
           py::keep_alive<1, 2>())
      .def_property_readonly("is_leader", &Decider::is_leader)
      .def("submit_plan", &Decider::SubmitPlan, py::arg("plan"))
      .def(
          "submit_plan",
          [](Decider& self, int64_t step, const Lengths& lengths, uint64_t sp, uint64_t tp,
             uint64_t budget) {
            self.SubmitPlan(BatchPlan{step, lengths.Get("lengths"), sp, tp, budget});
          },
          py::arg("step"), py::arg("lengths"), py::kw_only(),
          py::arg("predicted_peak_bytes_sp") = 0, py::arg("predicted_peak_bytes_tp") = 0,
          py::arg("memory_budget_bytes") = 0)
      .def(
          "decide",
          [](Decider& self, int64_t step, std::optional<double> timeout) {
            return self.Decide(step, 0, timeout);
          },
          py::arg("step"), py::arg("timeout") = py::none())
      .def("decide_microbatches", &Decider::Decide, py::arg("step"), py::arg("microbatches"),
           py::arg("timeout") = py::none())
      .def("report_telemetry", &Decider::ReportTelemetry, py::arg("telemetry"))
      .def(
          "report_telemetry",
          [](Decider& self, int64_t step, Mode mode, Reason reason, double step_time_s,
             double rs_wait_s, double all_gather_s, double norm_stall_s,
             int64_t effective_tokens, int64_t padding_tokens, uint64_t peak_memory_bytes,
             double all_reduce_s) {
            self.ReportTelemetry({.step = step, .mode = mode, .reason = reason,
                                  .step_time_s = step_time_s, .rs_wait_s = rs_wait_s,
                                  .all_gather_s = all_gather_s, .norm_stall_s = norm_stall_s,
                                  .effective_tokens = effective_tokens,
                                  .padding_tokens = padding_tokens,
                                  .peak_memory_bytes = peak_memory_bytes,
                                  .all_reduce_s = all_reduce_s});
          },
          py::arg("step"), py::arg("mode"), py::arg("reason"), py::arg("step_time_s"),
          py::kw_only(), py::arg("rs_wait_s") = 0.0, py::arg("all_gather_s") = 0.0,
          py::arg("norm_stall_s") = 0.0, py::arg("effective_tokens") = 0,
          py::arg("padding_tokens") = 0, py::arg("peak_memory_bytes") = 0,
          py::arg("all_reduce_s") = 0.0);

  m.def("wire_failure",
        [](int64_t step, int code) {
          client::DecisionWire w;
          w.step = step;
          w.status_code = code;
          return py::bytes(reinterpret_cast<const char*>(&w), sizeof(w));
        },
        py::arg("step"), py::arg("code"),
        "A DecisionWire carrying a leader's failure (tests, custom broadcasts).");
}

}  // namespace spgate::python
