// The pieces of spgate._spgate (python/spgate_module.cc) that more than one of its
// binding files shares: the error mapping (every failed absl::Status becomes spgate.Error or
// a subclass by code), the Python-owned plan values, the Client wrapper, and one Bind*
// function per area that PYBIND11_MODULE calls in order. Internal to the module: nothing
// outside python/ includes it.
//
// Invariant: a Bind* function registers only its own area's classes and functions; one
// that names another area's type in a default argument runs after that area's (the order in
// spgate_module.cc).
#ifndef SPGATE_PYTHON_BINDINGS_H_
#define SPGATE_PYTHON_BINDINGS_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "worker/client/gate_client.h"

namespace spgate::python {

namespace py = pybind11;

using client::GateClient;
using client::GateClientOptions;
using client::GateDecision;

// ---- errors ---------------------------------------------------------------------------

// Raises the spgate.Error subclass for status's code, the message prefixed by context.
[[noreturn]] void Raise(const absl::Status& status, const std::string& context = {});

inline void Check(const absl::Status& status, const std::string& context = {}) {
  if (!status.ok()) Raise(status, context);
}

// s seconds; InvalidArgumentError naming `name` unless finite and >= 0.
absl::Duration Seconds(double s, const char* name);

// ---- value types ----------------------------------------------------------------------

// Sequence lengths as Python passes them: any iterable of integers (a list, a tuple, a
// 1-D integer tensor or array). Get converts them: a bool or a value that is not an
// integer (5.7, a float tensor's element) is InvalidArgumentError naming its index, never
// truncated. The signature shows Sequence[int].
struct Lengths {
  py::object values;
  std::vector<int64_t> Get(const char* name) const;
};

// One micro-batch of a step plan (MicrobatchPlanInput holds a span; this owns its
// lengths). No lengths: the stage does not know them (SP, LENGTHS_UNKNOWN).
struct MicrobatchPlan {
  int id = 0;
  std::vector<int64_t> lengths;
  uint64_t activation_sp = 0, activation_tp = 0, workspace_sp = 0, workspace_tp = 0;
};

// BatchPlanInput holds spans; the Python BatchPlan owns its lengths and micro-batches.
struct BatchPlan {
  int64_t step = 0;
  std::vector<int64_t> lengths;
  uint64_t predicted_peak_bytes_sp = 0;
  uint64_t predicted_peak_bytes_tp = 0;
  uint64_t memory_budget_bytes = 0;
  std::vector<MicrobatchPlan> microbatches;  // a step plan (a client with a layout)
  uint64_t resident_bytes = 0;

  // Valid while this plan and `mbs` live.
  client::BatchPlanInput Input(std::vector<client::MicrobatchPlanInput>& mbs) const {
    mbs.clear();
    for (const MicrobatchPlan& m : microbatches) {
      mbs.push_back({.id = m.id, .lengths = m.lengths,
                     .memory = {.activation_sp = m.activation_sp,
                                .activation_tp = m.activation_tp,
                                .workspace_sp = m.workspace_sp,
                                .workspace_tp = m.workspace_tp}});
    }
    return {.step = step, .lengths = lengths, .predicted_peak_bytes_sp = predicted_peak_bytes_sp,
            .predicted_peak_bytes_tp = predicted_peak_bytes_tp,
            .memory_budget_bytes = memory_budget_bytes, .microbatches = mbs,
            .resident_bytes = resident_bytes};
  }
};

// ---- the client -------------------------------------------------------------------------

// spgate.Client. A call takes a hold on the GateClient (Get) for as long as it runs, the
// GIL released or not; close() (from any thread, a callback or a signal handler on the
// calling thread included) wakes every wait in progress (GateClient::Close) and lets go of
// its own hold: the GateClient is destroyed by whichever hold goes last — at once when no
// call is in progress, else when the last one returns — so a call in progress never finds
// it gone and close() never waits on a call below it on its own stack. client_ is read and
// written with the GIL held.
class Client {
 public:
  explicit Client(GateClientOptions options) {
    absl::StatusOr<std::unique_ptr<GateClient>> c = GateClient::Create(std::move(options));
    Check(c.status());
    client_ = std::shared_ptr<GateClient>(std::move(*c));
  }
  // The client for one call: FailedPreconditionError naming `what` once closed.
  std::shared_ptr<GateClient> Get(const char* what) const {
    if (!client_) {
      Raise(absl::FailedPreconditionError(absl::StrCat(what, ": the client is closed")));
    }
    return client_;
  }
  bool closed() const { return client_ == nullptr; }

  void Close() {
    std::shared_ptr<GateClient> c = std::move(client_);
    if (c == nullptr) return;
    py::gil_scoped_release release;
    c->Close();  // the other threads' waits return now
    c.reset();   // the last hold destroys it
  }

 private:
  std::shared_ptr<GateClient> client_;  // null once closed
};

// ---- the areas, in the order PYBIND11_MODULE registers them ------------------------------

void BindErrors(py::module_& m);     // spgate.Error and its subclasses
void BindEnums(py::module_& m);      // Mode, Reason, DecisionSource
void BindLayout(py::module_& m);     // JobLayout, StageCoordinates, stage_schedule
void BindPlans(py::module_& m);      // MicrobatchPlan, BatchPlan
void BindDecisions(py::module_& m);  // MicrobatchDecision, GateDecision
void BindTelemetry(py::module_& m);  // MicrobatchTelemetry, StepTelemetry, ClientStats
void BindClient(py::module_& m);     // Client, _cxx_step_loop
void BindGroupDecider(py::module_& m);  // GroupDecider, wire_failure
void BindIdentity(py::module_& m);   // launch credential, incarnation, worker token file

}  // namespace spgate::python

namespace pybind11::detail {

// Takes any iterable but str and bytes; Lengths::Get checks the elements.
template <>
struct type_caster<spgate::python::Lengths> {
  PYBIND11_TYPE_CASTER(spgate::python::Lengths, const_name("Sequence[int]"));
  bool load(handle src, bool) {
    if (!src || PyUnicode_Check(src.ptr()) || PyBytes_Check(src.ptr()) ||
        !hasattr(src, "__iter__")) {
      return false;
    }
    value.values = reinterpret_borrow<object>(src);
    return true;
  }
  static handle cast(const spgate::python::Lengths& l, return_value_policy, handle) {
    return l.values.inc_ref();
  }
};

}  // namespace pybind11::detail

#endif  // SPGATE_PYTHON_BINDINGS_H_
