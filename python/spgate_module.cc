// spgate._spgate: the Python binding of the C++ worker client (worker/client/gate_client.h,
// group_decider.h). Names follow C++: Client (GateClient), BatchPlan, GateDecision,
// StepTelemetry, Mode, Reason, DecisionSource, ClientStats, GroupDecider; for pipelined
// jobs (docs/design.md §12) JobLayout, StageCoordinates, MicrobatchPlan (a step plan's
// MicrobatchPlanInput), MicrobatchDecision (policy's Decision), stage_schedule
// (StageSchedule) and GroupDecider.decide_microbatches. Every failed
// absl::Status becomes spgate.Error (or a subclass by code) carrying .code, .code_name and
// the message; the semantics are the C++ ones (docs/client.md).
//
// Invariant: no call holds the GIL while it may wait - await_decision, flush,
// wait_until_connected, close, GroupDecider.decide and GroupDecider.report_telemetry
// release it (their broadcast and reduce callbacks take it back only to run the Python
// callable) - so other Python threads, and the other ranks' processes' progress, never
// stall on spgate.
//
// One Bind* function per area (python/bindings.h): bind_types.cc (enums, layout, plans,
// decisions, telemetry), bind_client.cc (Client and the identity helpers),
// bind_group_decider.cc (GroupDecider); this file holds the errors and the module.
#include <pybind11/pybind11.h>

#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "python/bindings.h"

namespace spgate::python {
namespace {

struct Errors {
  py::object base, invalid_argument, failed_precondition, deadline_exceeded, unavailable;
};
Errors* errors = nullptr;  // created once in the module init, never freed (like the module)

}  // namespace

[[noreturn]] void Raise(const absl::Status& status, const std::string& context) {
  py::object cls = errors->base;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument: cls = errors->invalid_argument; break;
    case absl::StatusCode::kFailedPrecondition: cls = errors->failed_precondition; break;
    case absl::StatusCode::kDeadlineExceeded: cls = errors->deadline_exceeded; break;
    case absl::StatusCode::kUnavailable: cls = errors->unavailable; break;
    default: break;
  }
  std::string message(status.message());
  if (!context.empty()) message = context + ": " + message;
  py::object exc = cls(message);
  exc.attr("code") = static_cast<int>(status.code());
  exc.attr("code_name") = absl::StatusCodeToString(status.code());
  exc.attr("message") = message;
  PyErr_SetObject(cls.ptr(), exc.ptr());
  throw py::error_already_set();
}

std::vector<int64_t> Lengths::Get(const char* name) const {
  // A mapping would give its keys and a set its own order: neither is a batch's lengths.
  if (PyAnySet_Check(values.ptr()) ||
      py::isinstance(values, py::module_::import("collections.abc").attr("Mapping"))) {
    Raise(absl::InvalidArgumentError(absl::StrCat(
        name, ": must be a sequence of integers (a list, a tuple, an integer array or "
        "tensor), got ", Py_TYPE(values.ptr())->tp_name)));
  }
  std::vector<int64_t> out;
  for (py::handle v : values) {
    // operator.index: integers and what stands for one (numpy's, an integer tensor's
    // element); a float, even 5.0, is a bug upstream.
    PyObject* n = PyBool_Check(v.ptr()) ? nullptr : PyNumber_Index(v.ptr());
    if (n == nullptr) {
      PyErr_Clear();
      std::string shown = py::repr(v);
      if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
      Raise(absl::InvalidArgumentError(absl::StrCat(name, "[", out.size(),
                                                    "]: must be an integer, got ",
                                                    Py_TYPE(v.ptr())->tp_name, " ", shown)));
    }
    const long long x = PyLong_AsLongLong(n);
    Py_DECREF(n);
    if (x == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      Raise(absl::InvalidArgumentError(
          absl::StrCat(name, "[", out.size(), "]: does not fit in 64 bits")));
    }
    out.push_back(x);
  }
  return out;
}

absl::Duration Seconds(double s, const char* name) {
  if (!std::isfinite(s) || s < 0) {
    Raise(absl::InvalidArgumentError(absl::StrCat(name, " must be a finite number of seconds >= 0, got ", s)));
  }
  return absl::Seconds(s);
}

namespace {

py::object MakeError(const char* name, const char* doc, py::handle bases) {
  PyObject* cls = PyErr_NewExceptionWithDoc(name, doc, bases.ptr(), nullptr);
  if (cls == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(cls);
}

}  // namespace

void BindErrors(py::module_& m) {
  errors = new Errors;
  errors->base = MakeError("spgate.Error",
                           "A failed spgate call: .code (absl/gRPC status code), .code_name, "
                           ".message.",
                           PyExc_RuntimeError);
  errors->invalid_argument = MakeError(
      "spgate.InvalidArgumentError", "INVALID_ARGUMENT: the message names the argument.",
      py::make_tuple(errors->base, py::handle(PyExc_ValueError)));
  errors->failed_precondition = MakeError("spgate.FailedPreconditionError",
                                          "FAILED_PRECONDITION (e.g. a non-leader submitting "
                                          "a plan, a closed client).",
                                          errors->base);
  errors->deadline_exceeded =
      MakeError("spgate.DeadlineExceededError", "DEADLINE_EXCEEDED.", errors->base);
  errors->unavailable = MakeError("spgate.UnavailableError", "UNAVAILABLE.", errors->base);
  m.attr("Error") = errors->base;
  m.attr("InvalidArgumentError") = errors->invalid_argument;
  m.attr("FailedPreconditionError") = errors->failed_precondition;
  m.attr("DeadlineExceededError") = errors->deadline_exceeded;
  m.attr("UnavailableError") = errors->unavailable;
}

}  // namespace spgate::python

PYBIND11_MODULE(_spgate, m) {
  using namespace spgate::python;
  m.doc() = "spgate worker client (pybind11 over worker/client); see spgate/__init__.py";
  m.attr("__version__") = SPGATE_VERSION;
  BindErrors(m);
  BindEnums(m);
  BindLayout(m);
  BindPlans(m);
  BindDecisions(m);
  BindTelemetry(m);
  BindClient(m);
  BindGroupDecider(m);
  BindIdentity(m);
}
