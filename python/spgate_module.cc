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
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <array>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <grpcpp/security/credentials.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "policy/gate_config.h"
#include "policy/pipeline_memory.h"
#include "policy/step_plan.h"
#include "worker/client/client_options.h"
#include "worker/client/gate_client.h"
#include "worker/client/identity.h"
#include "worker/client/group_decider.h"
#include "worker/client/tls.h"

namespace py = pybind11;

namespace spgate::python {
namespace {

using client::GateClient;
using client::GateClientOptions;
using client::GateDecision;

// ---- errors ---------------------------------------------------------------------------

struct Errors {
  py::object base, invalid_argument, failed_precondition, deadline_exceeded, unavailable;
};
Errors* errors = nullptr;  // created once in the module init, never freed (like the module)

[[noreturn]] void Raise(const absl::Status& status, const std::string& context = {}) {
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

void Check(const absl::Status& status, const std::string& context = {}) {
  if (!status.ok()) Raise(status, context);
}

py::object MakeError(const char* name, const char* doc, py::handle bases) {
  PyObject* cls = PyErr_NewExceptionWithDoc(name, doc, bases.ptr(), nullptr);
  if (cls == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(cls);
}

// ---- value types ----------------------------------------------------------------------

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

// JobLayout's schedule as Python spells it: "1f1b" or "interleaved_1f1b" (ScheduleName).
PipelineSchedule ScheduleFromName(const std::string& name) {
  for (PipelineSchedule s : {PipelineSchedule::k1F1B, PipelineSchedule::kInterleaved1F1B}) {
    if (ScheduleName(s) == name) return s;
  }
  Raise(absl::InvalidArgumentError(absl::StrCat(
      "layout.schedule: \"", name, "\" is neither \"1f1b\" nor \"interleaved_1f1b\"")));
}

// tls.<key> of a dict or an object with attributes; "" when absent or None.
std::string TlsSetting(const py::object& tls, const char* key) {
  py::object value = py::none();
  if (py::isinstance<py::dict>(tls)) {
    py::dict d = tls.cast<py::dict>();
    if (d.contains(key)) value = d[key];
  } else if (py::hasattr(tls, key)) {
    value = tls.attr(key);
  }
  return value.is_none() ? "" : std::string(py::str(value));
}

// tls: None (plaintext), or a dict / object with ca, cert, key (PEM paths) and
// server_name - spgate-worker's --tls_ca / --tls_cert / --tls_key / --tls_server_name,
// checked by the same helper (worker/client/tls.h). A tls= without ca or cert still
// means TLS, trusting the system's roots.
void ApplyTls(const py::object& tls, GateClientOptions* o) {
  if (tls.is_none()) return;
  constexpr client::TlsOptionNames kNames = {"tls.ca", "tls.cert", "tls.key", "tls.server_name"};
  const client::TlsClientOptions t{.ca = TlsSetting(tls, "ca"),
                                   .cert = TlsSetting(tls, "cert"),
                                   .key = TlsSetting(tls, "key"),
                                   .server_name = TlsSetting(tls, "server_name"),
                                   .force_tls = true};
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      client::TlsChannelCredentials(t, kNames);
  if (!credentials.ok()) Raise(credentials.status());
  o->credentials = *std::move(credentials);
  o->tls_server_name = t.server_name;
}

absl::Duration Seconds(double s, const char* name) {
  if (!std::isfinite(s) || s < 0) {
    Raise(absl::InvalidArgumentError(absl::StrCat(name, " must be a finite number of seconds >= 0, got ", s)));
  }
  return absl::Seconds(s);
}

// ---- the client -------------------------------------------------------------------------

class Client {
 public:
  explicit Client(GateClientOptions options) {
    absl::StatusOr<std::unique_ptr<GateClient>> c = GateClient::Create(std::move(options));
    Check(c.status());
    client_ = std::move(*c);
  }

  GateClient& Get(const char* what) const {
    if (!client_) {
      Raise(absl::FailedPreconditionError(absl::StrCat(what, ": the client is closed")));
    }
    return *client_;
  }
  GateClient* raw() const { return client_.get(); }
  bool closed() const { return client_ == nullptr; }

  void Close() {
    std::unique_ptr<GateClient> c = std::move(client_);
    py::gil_scoped_release release;
    c.reset();
  }

 private:
  std::unique_ptr<GateClient> client_;
};

void SubmitPlan(Client& self, const BatchPlan& plan) {
  std::vector<client::MicrobatchPlanInput> mbs;
  Check(self.Get("submit_plan").SubmitPlan(plan.Input(mbs)));
}

GateDecision AwaitDecision(Client& self, int64_t step, std::optional<double> timeout) {
  GateClient& c = self.Get("await_decision");
  absl::Time deadline = absl::Now() + (timeout ? Seconds(*timeout, "timeout")
                                               : c.options().decision_deadline);
  absl::StatusOr<GateDecision> d;
  {
    py::gil_scoped_release release;
    d = c.AwaitDecision(step, deadline);
  }
  Check(d.status());
  return *d;
}

// ---- the group decider ------------------------------------------------------------------

// Runs a Python collective on `wire`'s bytes: callable(buf: bytearray, root), which must
// leave buf the same size; its contents are copied back. With the GIL (taken here). A
// Python exception becomes INTERNAL with the exception's text.
template <typename Wire>
absl::Status CallWithBuffer(const py::object& fn, const char* what, Wire& wire, int root) {
  py::gil_scoped_acquire gil;
  try {
    py::bytearray buf(reinterpret_cast<const char*>(&wire), sizeof(wire));
    fn(buf, root);
    const Py_ssize_t n = PyByteArray_Size(buf.ptr());
    if (n != static_cast<Py_ssize_t>(sizeof(wire))) {
      return absl::InternalError(
          absl::StrCat(what, " left ", n, " bytes in the ", sizeof(wire), "-byte buffer"));
    }
    std::memcpy(&wire, PyByteArray_AsString(buf.ptr()), sizeof(wire));
    return absl::OkStatus();
  } catch (py::error_already_set& e) {
    return absl::InternalError(absl::StrCat(what, " failed: ", e.what()));
  }
}

// CallWithBuffer for a run of bytes (a step plan's micro-batch decisions).
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

// C++ GroupDecider over a Python broadcast: broadcast(buf: bytearray of 24 bytes, root)
// fills buf with the root's bytes on the other ranks; and, for the leader's group session,
// a Python max-reduce: reduce(buf: bytearray of 112 bytes = 14 little-endian float64,
// root) leaves the element-wise maximum over the group in the root's buf. A Python
// exception in either becomes INTERNAL with the exception's text.
class Decider {
 public:
  Decider(Client* client, int rank_in_group, py::object broadcast, py::object reduce)
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
    auto fn = [this](client::DecisionWire& wire, int root) {
      return CallWithBuffer(broadcast_, "broadcast", wire, root);
    };
    client::MaxReduceFn reduce_fn;  // empty: each rank reports through its own client
    client::VectorMaxReduceFn reduce_vector_fn;
    if (!reduce_.is_none()) {
      reduce_fn = [this](client::TelemetryWire& wire, int root) {
        return CallWithBuffer(reduce_, "reduce", wire, root);
      };
      // A step plan's record with its micro-batches' (docs/design.md §12): the same
      // callable, over 14 + 7 x microbatches doubles.
      reduce_vector_fn = [this](std::span<double> values, int root) {
        return CallWithBytes(reduce_, "reduce",
                             std::span<uint8_t>(reinterpret_cast<uint8_t*>(values.data()),
                                                values.size_bytes()),
                             root);
      };
    }
    // A step plan's micro-batch decisions go over the same broadcast, one byte each.
    auto bytes_fn = [this](std::span<uint8_t> bytes, int root) {
      return CallWithBytes(broadcast_, "broadcast", bytes, root);
    };
    auto d = client::GroupDecider::Create(client != nullptr ? client->raw() : nullptr,
                                          rank_in_group, std::move(fn), std::move(reduce_fn),
                                          std::move(bytes_fn), std::move(reduce_vector_fn));
    Check(d.status());
    decider_ = std::move(*d);
  }

  bool is_leader() const { return decider_->is_leader(); }

  void SubmitPlan(const BatchPlan& plan) {
    if (!is_leader()) return;
    client_->Get("submit_plan");
    std::vector<client::MicrobatchPlanInput> mbs;
    Check(decider_->SubmitPlan(plan.Input(mbs)));
  }

  GateDecision Decide(int64_t step, std::optional<double> timeout) {
    absl::Time deadline = absl::InfiniteFuture();
    if (is_leader()) {
      GateClient& c = client_->Get("decide");
      deadline = absl::Now() + (timeout ? Seconds(*timeout, "timeout")
                                        : c.options().decision_deadline);
    }
    absl::StatusOr<GateDecision> d;
    {
      py::gil_scoped_release release;
      d = decider_->Decide(step, deadline);
    }
    Check(d.status());
    return *d;
  }

  // Collective: a step plan's decision, micro-batch by micro-batch, on every rank.
  GateDecision DecideMicrobatches(int64_t step, int microbatches, std::optional<double> timeout) {
    absl::Time deadline = absl::InfiniteFuture();
    if (is_leader()) {
      GateClient& c = client_->Get("decide_microbatches");
      deadline = absl::Now() + (timeout ? Seconds(*timeout, "timeout")
                                        : c.options().decision_deadline);
    }
    absl::StatusOr<GateDecision> d;
    {
      py::gil_scoped_release release;
      d = decider_->DecideMicrobatches(step, microbatches, deadline);
    }
    Check(d.status());
    return *d;
  }

  // Collective with a reduce (every rank, every step it reports); else the rank's own
  // client's ReportTelemetry.
  void ReportTelemetry(const client::StepTelemetryInput& t) {
    if (client_ != nullptr) client_->Get("report_telemetry");  // not closed
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

py::bytes ToWireBytes(const GateDecision& d) {
  client::DecisionWire w = client::ToWire(d);
  return py::bytes(reinterpret_cast<const char*>(&w), sizeof(w));
}

GateDecision FromWireBytes(const py::bytes& b) {
  std::string s = b;
  if (s.size() != sizeof(client::DecisionWire)) {
    Raise(absl::InvalidArgumentError(absl::StrCat("wire: expected 24 bytes, got ", s.size())));
  }
  client::DecisionWire w;
  std::memcpy(&w, s.data(), sizeof(w));
  if (w.status_code != 0) {
    Raise(absl::Status(static_cast<absl::StatusCode>(w.status_code),
                       absl::StrCat("the group leader could not decide step ", w.step)));
  }
  absl::StatusOr<GateDecision> d = client::FromWire(w);
  Check(d.status());
  return *d;
}

std::string DecisionRepr(const GateDecision& d) {
  return absl::StrCat("GateDecision(step=", d.step, ", mode=", std::string(ModeLabel(d.mode)),
                      ", reason=", std::string(ReasonLabel(d.reason)), ", policy_reason=",
                      std::string(ReasonLabel(d.policy_reason)), ", source=",
                      std::string(client::DecisionSourceLabel(d.source)), ", config_version=",
                      d.config_version, ")");
}

// ---- Client(...)'s keyword arguments, from the option table ------------------------------

// The rows of kClientOptions that spgate.Client takes, in table order.
constexpr auto kPythonOptions = [] {
  constexpr size_t n = [] {
    size_t k = 0;
    for (const client::ClientOption& row : client::kClientOptions) k += row.in_python();
    return k;
  }();
  std::array<size_t, n> rows{};
  size_t k = 0;
  for (size_t i = 0; i < client::kClientOptions.size(); ++i) {
    if (client::kClientOptions[i].in_python()) rows[k++] = i;
  }
  return rows;
}();

constexpr const client::ClientOption& PythonRow(size_t i) {
  return client::kClientOptions[kPythonOptions[i]];
}

// A row's type as Python passes it: durations are seconds.
template <client::ClientOptionType T>
using PythonType = std::conditional_t<T == client::ClientOptionType::kDuration, double,
                                      typename client::ClientOptionCxx<T>::type>;

// Required in Python although the C++ default is empty: a job must say who it is.
constexpr std::string_view kRequiredInPython = "job_id";

// py::arg(name) = the table's default (a duration in seconds), or a bare py::arg for the
// one required keyword.
template <size_t I>
auto PythonArg() {
  constexpr const client::ClientOption& row = PythonRow(I);
  if constexpr (row.name == kRequiredInPython) {
    return py::arg(row.name.data());
  } else {
    using Cxx = typename client::ClientOptionCxx<row.type>::type;
    static const GateClientOptions kDefaults;
    const Cxx& def = client::ClientOptionRef<Cxx>(kDefaults, row);
    if constexpr (row.type == client::ClientOptionType::kDuration) {
      return py::arg(row.name.data()) = absl::ToDoubleSeconds(def);
    } else {
      return py::arg(row.name.data()) = def;
    }
  }
}

template <size_t I>
void SetFromPython(GateClientOptions& o, PythonType<PythonRow(I).type> value) {
  constexpr const client::ClientOption& row = PythonRow(I);
  if constexpr (row.type == client::ClientOptionType::kDuration) {
    client::ClientOptionRef<absl::Duration>(o, row) = Seconds(value, row.name.data());
  } else {
    client::ClientOptionRef<typename client::ClientOptionCxx<row.type>::type>(o, row) =
        std::move(value);
  }
}

// Client(*, <every Python row of the table>, tls=None): one keyword per row, typed and
// defaulted by the table, so the signature pybind11 reports is the table's.
template <size_t... I>
void DefClientInit(py::class_<Client>& cls, std::index_sequence<I...>) {
  cls.def(py::init([](PythonType<PythonRow(I).type>... values,
                      std::optional<JobLayout> layout, std::optional<StageCoordinates> coordinates,
                      std::vector<std::string> sp_required, py::object tls) {
            GateClientOptions o;
            (SetFromPython<I>(o, std::move(values)), ...);
            // A pipelined job (docs/design.md §12): checked by GateClient::Create.
            o.layout = layout;
            if (coordinates) o.coordinates = *coordinates;
            if (coordinates && !layout) {
              Raise(absl::InvalidArgumentError("coordinates: need a layout"));
            }
            o.sp_required = std::move(sp_required);
            // One launch of the job, equal on every rank: given, or the launcher's.
            if (o.incarnation.empty()) o.incarnation = client::IncarnationFromEnvironment();
            // Its secret: given (spgate.torch.agree_on_launch), or SPGATE_LAUNCH_CREDENTIAL;
            // never made here, where it could not reach the other ranks.
            if (o.launch_credential.empty()) {
              o.launch_credential = client::LaunchCredentialFromEnvironment();
            }
            ApplyTls(tls, &o);
            return std::make_unique<Client>(std::move(o));
          }),
          py::kw_only(), PythonArg<I>()..., py::arg("layout") = py::none(),
          py::arg("coordinates") = py::none(),
          py::arg("sp_required") = std::vector<std::string>{}, py::arg("tls") = py::none());
}

// The C++ path of bench/python/client_step_bench.py, run on the same Client in the same
// process: SubmitPlan(n + 1) + AwaitDecision(n) + ReportTelemetry(n) timed per call with
// steady_clock (bench/client/client_step_bench.cc's loop); between steps, untimed, a sleep
// of step_us and a yield loop until decision n + 1 has arrived.
py::dict CxxStepLoop(Client& self, int64_t first_step, int warmup, int steps,
                     std::vector<int64_t> lengths, int step_us) {
  GateClient& c = self.Get("_cxx_step_loop");
  using Clock = std::chrono::steady_clock;
  std::vector<double> submit_ns, await_ns, report_ns;
  int64_t not_from_daemon = 0;
  const bool remote = !c.options().controller.empty();
  {
    py::gil_scoped_release release;
    const int64_t base_received = c.stats().decisions_received;
    auto ready = [&](int64_t n) {
      if (step_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(step_us));
      const auto give_up = Clock::now() + std::chrono::seconds(1);
      while (remote && c.stats().decisions_received < base_received + (n - first_step) + 1 &&
             Clock::now() < give_up) {
        std::this_thread::yield();
      }
    };
    Mode mode = Mode::kSequenceParallel;
    Reason reason = Reason::kGatesPassed;
    (void)c.SubmitPlan({.step = first_step, .lengths = lengths});
    ready(first_step);
    for (int64_t i = 0; i < warmup + steps; ++i) {
      const int64_t n = first_step + i;
      const auto t0 = Clock::now();
      (void)c.SubmitPlan({.step = n + 1, .lengths = lengths});
      const auto t1 = Clock::now();
      auto d = c.AwaitDecision(n, absl::Now() + c.options().decision_deadline);
      const auto t2 = Clock::now();
      if (d.ok()) {
        mode = d->mode;
        reason = d->reason;
        if (remote && d->source != client::DecisionSource::kDaemon && i >= warmup) ++not_from_daemon;
      }
      (void)c.ReportTelemetry({.step = n, .mode = mode, .reason = reason, .step_time_s = 0.1,
                               .rs_wait_s = 0.004, .all_gather_s = 0.003,
                               .effective_tokens = 65536, .peak_memory_bytes = 40ull << 30});
      const auto t3 = Clock::now();
      if (i >= warmup) {
        auto ns = [](auto a, auto b) {
          return std::chrono::duration<double, std::nano>(b - a).count();
        };
        submit_ns.push_back(ns(t0, t1));
        await_ns.push_back(ns(t1, t2));
        report_ns.push_back(ns(t2, t3));
      }
      ready(n + 1);
    }
  }
  py::dict out;
  out["submit_ns"] = submit_ns;
  out["await_ns"] = await_ns;
  out["report_ns"] = report_ns;
  out["not_from_daemon"] = not_from_daemon;
  return out;
}

}  // namespace

PYBIND11_MODULE(_spgate, m) {
  m.doc() = "spgate worker client (pybind11 over worker/client); see spgate/__init__.py";
  m.attr("__version__") = SPGATE_VERSION;

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

  py::enum_<Mode> mode(m, "Mode", py::arithmetic());
  mode.value("SEQUENCE_PARALLEL", Mode::kSequenceParallel)
      .value("TENSOR_PARALLEL_ONLY", Mode::kTensorParallelOnly)
      .def_property_readonly("label", [](Mode v) { return std::string(ModeLabel(v)); });
  py::enum_<Reason>(m, "Reason", py::arithmetic())
      .value("GATES_PASSED", Reason::kGatesPassed)
      .value("LENGTH_CV", Reason::kLengthCv)
      .value("RS_WAIT", Reason::kRsWait)
      .value("PROBE", Reason::kProbe)
      .value("MEMORY_REQUIRES_SP", Reason::kMemoryRequiresSp)
      .value("MEMORY_OVER_BUDGET", Reason::kMemoryOverBudget)
      .value("PINNED", Reason::kPinned)
      .value("CONTROLLER_UNAVAILABLE", Reason::kControllerUnavailable)
      .value("ADAPTIVE", Reason::kAdaptive)
      .value("LENGTHS_UNKNOWN", Reason::kLengthsUnknown)
      .value("SP_REQUIRED", Reason::kSpRequired)
      .def_property_readonly("label", [](Reason v) { return std::string(ReasonLabel(v)); });
  py::enum_<client::DecisionSource>(m, "DecisionSource", py::arithmetic())
      .value("DAEMON", client::DecisionSource::kDaemon)
      .value("FALLBACK", client::DecisionSource::kFallback)
      .value("LOCAL_ONLY", client::DecisionSource::kLocalOnly)
      .value("MEMORY_OVERRIDE", client::DecisionSource::kMemoryOverride)
      .def_property_readonly("label", [](client::DecisionSource v) {
        return std::string(client::DecisionSourceLabel(v));
      });

  py::class_<JobLayout>(m, "JobLayout")
      .def(py::init([](int tp, int pp, int vp, int cp, int dp, int microbatches,
                       const std::string& schedule) {
             return JobLayout{.tp = tp, .pp = pp, .vp = vp, .cp = cp, .dp = dp,
                              .microbatches = microbatches,
                              .schedule = ScheduleFromName(schedule)};
           }),
           py::kw_only(), py::arg("tp") = 1, py::arg("pp") = 1, py::arg("vp") = 1,
           py::arg("cp") = 1, py::arg("dp") = 1, py::arg("microbatches") = 1,
           py::arg("schedule") = "1f1b")
      .def_readwrite("tp", &JobLayout::tp)
      .def_readwrite("pp", &JobLayout::pp)
      .def_readwrite("vp", &JobLayout::vp)
      .def_readwrite("cp", &JobLayout::cp)
      .def_readwrite("dp", &JobLayout::dp)
      .def_readwrite("microbatches", &JobLayout::microbatches)
      .def_property(
          "schedule", [](const JobLayout& l) { return std::string(ScheduleName(l.schedule)); },
          [](JobLayout& l, const std::string& name) { l.schedule = ScheduleFromName(name); })
      .def("validate", [](const JobLayout& l) { Check(ValidateJobLayout(l)); },
           "InvalidArgumentError naming the field when the layout is not a valid one.")
      .def("__eq__", [](const JobLayout& a, const JobLayout& b) { return a == b; })
      .def("__repr__", [](const JobLayout& l) {
        return absl::StrCat("JobLayout(", FormatJobLayout(l), ")");
      });

  py::class_<StageCoordinates>(m, "StageCoordinates")
      .def(py::init([](int dp_index, int stage, int cp_rank) {
             return StageCoordinates{.dp_index = dp_index, .stage = stage, .cp_rank = cp_rank};
           }),
           py::kw_only(), py::arg("dp_index") = 0, py::arg("stage") = 0, py::arg("cp_rank") = 0)
      .def_readwrite("dp_index", &StageCoordinates::dp_index)
      .def_readwrite("stage", &StageCoordinates::stage)
      .def_readwrite("cp_rank", &StageCoordinates::cp_rank)
      .def("group", [](const StageCoordinates& c, const JobLayout& l) {
             Check(ValidateCoordinates(l, c));
             return GroupOf(l, c);
           }, py::arg("layout"),
           "The TP group index of these coordinates: (dp_index * pp + stage) * cp + cp_rank.")
      .def("__eq__", [](const StageCoordinates& a, const StageCoordinates& b) { return a == b; })
      .def("__repr__", [](const StageCoordinates& c) {
        return absl::StrCat("StageCoordinates(dp_index=", c.dp_index, ", stage=", c.stage,
                            ", cp_rank=", c.cp_rank, ")");
      });

  py::class_<MicrobatchPlan>(m, "MicrobatchPlan")
      .def(py::init([](int id, std::vector<int64_t> lengths, uint64_t asp, uint64_t atp,
                       uint64_t wsp, uint64_t wtp) {
             return MicrobatchPlan{id, std::move(lengths), asp, atp, wsp, wtp};
           }),
           py::arg("id"), py::arg("lengths") = std::vector<int64_t>{}, py::kw_only(),
           py::arg("activation_sp") = 0, py::arg("activation_tp") = 0,
           py::arg("workspace_sp") = 0, py::arg("workspace_tp") = 0)
      .def_readwrite("id", &MicrobatchPlan::id)
      .def_readwrite("lengths", &MicrobatchPlan::lengths)
      .def_readwrite("activation_sp", &MicrobatchPlan::activation_sp)
      .def_readwrite("activation_tp", &MicrobatchPlan::activation_tp)
      .def_readwrite("workspace_sp", &MicrobatchPlan::workspace_sp)
      .def_readwrite("workspace_tp", &MicrobatchPlan::workspace_tp)
      .def("__repr__", [](const MicrobatchPlan& p) {
        return absl::StrCat("MicrobatchPlan(id=", p.id, ", lengths=<", p.lengths.size(),
                            " sequences>)");
      });

  py::class_<BatchPlan>(m, "BatchPlan")
      .def(py::init([](int64_t step, std::vector<int64_t> lengths, uint64_t sp, uint64_t tp,
                       uint64_t budget, std::vector<MicrobatchPlan> microbatches,
                       uint64_t resident) {
             return BatchPlan{step, std::move(lengths), sp, tp, budget, std::move(microbatches),
                              resident};
           }),
           py::arg("step"), py::arg("lengths") = std::vector<int64_t>{},
           py::arg("predicted_peak_bytes_sp") = 0, py::arg("predicted_peak_bytes_tp") = 0,
           py::arg("memory_budget_bytes") = 0,
           py::arg("microbatches") = std::vector<MicrobatchPlan>{},
           py::arg("resident_bytes") = 0)
      .def_readwrite("step", &BatchPlan::step)
      .def_readwrite("lengths", &BatchPlan::lengths)
      .def_readwrite("predicted_peak_bytes_sp", &BatchPlan::predicted_peak_bytes_sp)
      .def_readwrite("predicted_peak_bytes_tp", &BatchPlan::predicted_peak_bytes_tp)
      .def_readwrite("memory_budget_bytes", &BatchPlan::memory_budget_bytes)
      .def_readwrite("microbatches", &BatchPlan::microbatches)
      .def_readwrite("resident_bytes", &BatchPlan::resident_bytes)
      .def("__repr__", [](const BatchPlan& p) {
        if (!p.microbatches.empty()) {
          return absl::StrCat("BatchPlan(step=", p.step, ", microbatches=<",
                              p.microbatches.size(), " micro-batches>)");
        }
        return absl::StrCat("BatchPlan(step=", p.step, ", lengths=<", p.lengths.size(),
                            " sequences>)");
      });

  py::class_<Decision>(m, "MicrobatchDecision")
      .def(py::init([](Mode mode, Reason reason) { return Decision{mode, reason}; }),
           py::arg("mode"), py::arg("reason"))
      .def_readonly("mode", &Decision::mode)
      .def_readonly("reason", &Decision::reason)
      .def("__eq__", [](const Decision& a, const Decision& b) { return a == b; })
      .def("__repr__", [](const Decision& d) {
        return absl::StrCat("MicrobatchDecision(mode=", std::string(ModeLabel(d.mode)),
                            ", reason=", std::string(ReasonLabel(d.reason)), ")");
      });

  py::class_<GateDecision>(m, "GateDecision")
      .def(py::init([](int64_t step, Mode mode, Reason reason, std::optional<Reason> policy_reason,
                       client::DecisionSource source, int64_t config_version) {
             return GateDecision{step, mode, reason, policy_reason.value_or(reason), source,
                                 config_version};
           }),
           py::arg("step"), py::arg("mode"), py::arg("reason"),
           py::arg("policy_reason") = py::none(),
           py::arg("source") = client::DecisionSource::kDaemon, py::arg("config_version") = 0)
      .def_readonly("step", &GateDecision::step)
      .def_readonly("mode", &GateDecision::mode)
      .def_readonly("reason", &GateDecision::reason)
      .def_readonly("policy_reason", &GateDecision::policy_reason)
      .def_readonly("source", &GateDecision::source)
      .def_readonly("config_version", &GateDecision::config_version)
      .def_readonly("microbatches", &GateDecision::microbatches,
                    "A step plan's decision per micro-batch, by id (empty for a plain plan).")
      .def_readonly("stage_peak_bytes", &GateDecision::stage_peak_bytes,
                    "A step plan's predicted stage peak with these modes (the leader's).")
      .def_property_readonly("sequence_parallel",
                             [](const GateDecision& d) { return d.mode == Mode::kSequenceParallel; })
      .def("to_wire", &ToWireBytes, "The 24-byte DecisionWire that GroupDecider broadcasts.")
      .def_static("from_wire", &FromWireBytes, py::arg("wire"),
                  "Decodes a DecisionWire; raises the leader's error if it carries one.")
      .def("__eq__", [](const GateDecision& a, const GateDecision& b) { return a == b; })
      .def("__repr__", &DecisionRepr);

  py::class_<MicrobatchTelemetryValues>(m, "MicrobatchTelemetry")
      .def(py::init([](int id, Mode mode, double forward_s, double backward_s, double rs_wait_s,
                       double all_gather_s, int64_t effective_tokens) {
             return MicrobatchTelemetryValues{.id = id,
                                              .mode = mode,
                                              .forward_s = forward_s,
                                              .backward_s = backward_s,
                                              .rs_wait_s = rs_wait_s,
                                              .all_gather_s = all_gather_s,
                                              .effective_tokens = effective_tokens};
           }),
           py::arg("id"), py::arg("mode"), py::arg("forward_s"), py::arg("backward_s"),
           py::arg("rs_wait_s") = 0.0, py::arg("all_gather_s") = 0.0,
           py::arg("effective_tokens") = 0)
      .def_readwrite("id", &MicrobatchTelemetryValues::id)
      .def_readwrite("mode", &MicrobatchTelemetryValues::mode)
      .def_readwrite("forward_s", &MicrobatchTelemetryValues::forward_s)
      .def_readwrite("backward_s", &MicrobatchTelemetryValues::backward_s)
      .def_readwrite("rs_wait_s", &MicrobatchTelemetryValues::rs_wait_s)
      .def_readwrite("all_gather_s", &MicrobatchTelemetryValues::all_gather_s)
      .def_readwrite("effective_tokens", &MicrobatchTelemetryValues::effective_tokens)
      .def("__eq__", [](const MicrobatchTelemetryValues& a, const MicrobatchTelemetryValues& b) {
        return a == b;
      });

  py::class_<client::StepTelemetryInput>(m, "StepTelemetry")
      .def(py::init([](int64_t step, Mode mode, Reason reason, double step_time_s, double rs_wait_s,
                       double all_gather_s, double norm_stall_s, int64_t effective_tokens,
                       int64_t padding_tokens, uint64_t peak_memory_bytes,
                       std::vector<MicrobatchTelemetryValues> microbatches) {
             client::StepTelemetryInput t{step, mode, reason, step_time_s, rs_wait_s,
                                          all_gather_s, norm_stall_s, effective_tokens,
                                          padding_tokens, peak_memory_bytes};
             t.microbatches = std::move(microbatches);
             return t;
           }),
           py::arg("step"), py::arg("mode"), py::arg("reason"), py::arg("step_time_s"),
           py::arg("rs_wait_s") = 0.0, py::arg("all_gather_s") = 0.0,
           py::arg("norm_stall_s") = 0.0, py::arg("effective_tokens") = 0,
           py::arg("padding_tokens") = 0, py::arg("peak_memory_bytes") = 0,
           py::arg("microbatches") = std::vector<MicrobatchTelemetryValues>{})
      .def_readwrite("microbatches", &client::StepTelemetryInput::microbatches)
      .def_readwrite("step", &client::StepTelemetryInput::step)
      .def_readwrite("mode", &client::StepTelemetryInput::mode)
      .def_readwrite("reason", &client::StepTelemetryInput::reason)
      .def_readwrite("step_time_s", &client::StepTelemetryInput::step_time_s)
      .def_readwrite("rs_wait_s", &client::StepTelemetryInput::rs_wait_s)
      .def_readwrite("all_gather_s", &client::StepTelemetryInput::all_gather_s)
      .def_readwrite("norm_stall_s", &client::StepTelemetryInput::norm_stall_s)
      .def_readwrite("effective_tokens", &client::StepTelemetryInput::effective_tokens)
      .def_readwrite("padding_tokens", &client::StepTelemetryInput::padding_tokens)
      .def_readwrite("peak_memory_bytes", &client::StepTelemetryInput::peak_memory_bytes);

  py::class_<client::GateClientStats>(m, "ClientStats")
      .def_readonly("connected", &client::GateClientStats::connected)
      .def_readonly("registrations", &client::GateClientStats::registrations)
      .def_readonly("streams_opened", &client::GateClientStats::streams_opened)
      .def_readonly("stream_failures", &client::GateClientStats::stream_failures)
      .def_readonly("plans_submitted", &client::GateClientStats::plans_submitted)
      .def_readonly("plans_sent", &client::GateClientStats::plans_sent)
      .def_readonly("plans_rejected", &client::GateClientStats::plans_rejected)
      .def_readonly("decisions_received", &client::GateClientStats::decisions_received)
      .def_readonly("daemon_decisions", &client::GateClientStats::daemon_decisions)
      .def_readonly("late_decisions", &client::GateClientStats::late_decisions)
      .def_readonly("local_decisions", &client::GateClientStats::local_decisions)
      .def_readonly("memory_overrides", &client::GateClientStats::memory_overrides)
      .def_readonly("config_updates", &client::GateClientStats::config_updates)
      .def_readonly("telemetry_reported", &client::GateClientStats::telemetry_reported)
      .def_readonly("telemetry_sent", &client::GateClientStats::telemetry_sent)
      .def_readonly("telemetry_acked", &client::GateClientStats::telemetry_acked)
      .def_readonly("telemetry_dropped", &client::GateClientStats::telemetry_dropped)
      .def_readonly("last_decided_step", &client::GateClientStats::last_decided_step)
      .def_readonly("session_replaced", &client::GateClientStats::session_replaced)
      .def_readonly("last_error", &client::GateClientStats::last_error);

  py::class_<Client> client_class(m, "Client");
  DefClientInit(client_class, std::make_index_sequence<kPythonOptions.size()>());
  client_class
      .def("submit_plan", &SubmitPlan, py::arg("plan"))
      .def(
          "submit_plan",
          [](Client& self, int64_t step, std::vector<int64_t> lengths, uint64_t sp, uint64_t tp,
             uint64_t budget) { SubmitPlan(self, BatchPlan{step, std::move(lengths), sp, tp, budget}); },
          py::arg("step"), py::arg("lengths"), py::kw_only(),
          py::arg("predicted_peak_bytes_sp") = 0, py::arg("predicted_peak_bytes_tp") = 0,
          py::arg("memory_budget_bytes") = 0)
      .def("await_decision", &AwaitDecision, py::arg("step"), py::arg("timeout") = py::none())
      .def("report_telemetry",
           [](Client& self, const client::StepTelemetryInput& t) {
             Check(self.Get("report_telemetry").ReportTelemetry(t));
           },
           py::arg("telemetry"))
      .def("observe_group_rs_wait_share",
           [](Client& self, int64_t step, Mode mode, double share) {
             self.Get("observe_group_rs_wait_share").ObserveGroupRsWaitShare(step, mode, share);
           },
           py::arg("step"), py::arg("mode"), py::arg("share"))
      .def("flush",
           [](Client& self, double timeout) {
             GateClient& c = self.Get("flush");
             absl::Duration d = Seconds(timeout, "timeout");
             absl::Status s;
             {
               py::gil_scoped_release release;
               s = c.Flush(d);
             }
             Check(s);
           },
           py::arg("timeout") = 5.0)
      .def("wait_until_connected",
           [](Client& self, double timeout) {
             GateClient& c = self.Get("wait_until_connected");
             absl::Duration d = Seconds(timeout, "timeout");
             absl::Status s;
             {
               py::gil_scoped_release release;
               s = c.WaitUntilConnected(d);
             }
             Check(s);
           },
           py::arg("timeout"))
      .def("stats", [](Client& self) { return self.Get("stats").stats(); })
      .def("config_for",
           [](Client& self, int64_t step) {
             client::ScheduledConfig sc = self.Get("config_for").ConfigFor(step);
             const GateConfig& c = sc.config;
             py::dict d;
             d["version"] = sc.version;
             d["effective_from_step"] = sc.effective_from_step;
             for (const GateField& f : kGateFields) {  // every field, from the one table
               const std::string name(f.name);
               if (f.is_choice()) {
                 d[name.c_str()] = GateFieldText(c, f);
               } else if (f.is_count()) {
                 d[name.c_str()] = c.*f.count;
               } else {
                 d[name.c_str()] = c.*f.real;
               }
             }
             return d;
           },
           py::arg("step"))
      .def("take_decision_latencies",
           [](Client& self) {
             std::vector<std::pair<double, double>> out;
             for (const auto& l : self.Get("take_decision_latencies").TakeDecisionLatencies()) {
               out.emplace_back(l.total_s, l.queued_s);
             }
             return out;
           })
      .def_property_readonly("is_leader",
                             [](Client& self) { return self.Get("is_leader").options().rank_in_group == 0; })
      .def_property_readonly("job_id", [](Client& self) { return self.Get("job_id").options().job_id; })
      .def_property_readonly("group", [](Client& self) { return self.Get("group").options().group; })
      .def_property_readonly("rank_in_group",
                             [](Client& self) { return self.Get("rank_in_group").options().rank_in_group; })
      .def_property_readonly("group_size",
                             [](Client& self) { return self.Get("group_size").options().group_size; })
      .def_property_readonly("group_session",
                             [](Client& self) { return self.Get("group_session").options().group_session; })
      .def_property_readonly("closed", &Client::closed)
      .def("close", &Client::Close)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](Client& self, py::args) {
        self.Close();
        return false;
      });

  py::class_<Decider>(m, "GroupDecider")
      .def(py::init([](py::object client, int rank_in_group, py::object broadcast,
                       py::object reduce) {
             Client* c = client.is_none() ? nullptr : client.cast<Client*>();
             return std::make_unique<Decider>(c, rank_in_group, std::move(broadcast),
                                              std::move(reduce));
           }),
           py::arg("client"), py::arg("rank_in_group"), py::arg("broadcast"),
           py::arg("reduce") = py::none(), py::keep_alive<1, 2>())
      .def_property_readonly("is_leader", &Decider::is_leader)
      .def("submit_plan", &Decider::SubmitPlan, py::arg("plan"))
      .def(
          "submit_plan",
          [](Decider& self, int64_t step, std::vector<int64_t> lengths, uint64_t sp, uint64_t tp,
             uint64_t budget) { self.SubmitPlan(BatchPlan{step, std::move(lengths), sp, tp, budget}); },
          py::arg("step"), py::arg("lengths"), py::kw_only(),
          py::arg("predicted_peak_bytes_sp") = 0, py::arg("predicted_peak_bytes_tp") = 0,
          py::arg("memory_budget_bytes") = 0)
      .def("decide", &Decider::Decide, py::arg("step"), py::arg("timeout") = py::none())
      .def("decide_microbatches", &Decider::DecideMicrobatches, py::arg("step"),
           py::arg("microbatches"), py::arg("timeout") = py::none())
      .def("report_telemetry", &Decider::ReportTelemetry, py::arg("telemetry"))
      .def(
          "report_telemetry",
          [](Decider& self, int64_t step, Mode mode, Reason reason, double step_time_s,
             double rs_wait_s, double all_gather_s, double norm_stall_s,
             int64_t effective_tokens, int64_t padding_tokens, uint64_t peak_memory_bytes) {
            self.ReportTelemetry({.step = step, .mode = mode, .reason = reason,
                                  .step_time_s = step_time_s, .rs_wait_s = rs_wait_s,
                                  .all_gather_s = all_gather_s, .norm_stall_s = norm_stall_s,
                                  .effective_tokens = effective_tokens,
                                  .padding_tokens = padding_tokens,
                                  .peak_memory_bytes = peak_memory_bytes});
          },
          py::arg("step"), py::arg("mode"), py::arg("reason"), py::arg("step_time_s"),
          py::kw_only(), py::arg("rs_wait_s") = 0.0, py::arg("all_gather_s") = 0.0,
          py::arg("norm_stall_s") = 0.0, py::arg("effective_tokens") = 0,
          py::arg("padding_tokens") = 0, py::arg("peak_memory_bytes") = 0);

  m.def("_cxx_step_loop", &CxxStepLoop, py::arg("client"), py::arg("first_step"),
        py::arg("warmup"), py::arg("steps"), py::arg("lengths"), py::arg("step_us"),
        "Benchmark helper (bench/python): the C++ client's per-step loop on this client.");
  m.def("stage_schedule",
        [](const JobLayout& layout, int stage) {
          absl::StatusOr<std::vector<PipelineOp>> ops = StageSchedule(layout.pipeline(), stage);
          Check(ops.status());
          std::vector<std::tuple<bool, int, int>> out;
          for (const PipelineOp& op : *ops) out.emplace_back(op.forward, op.microbatch, op.chunk);
          return out;
        },
        py::arg("layout"), py::arg("stage"),
        "Stage `stage`'s forwards and backwards in the order the schedule runs them, as "
        "(forward, micro-batch, chunk): policy/pipeline_memory.h's StageSchedule, the order "
        "the schedule-aware memory gate assumed.");
  m.def("new_launch_credential",
        [] {
          absl::StatusOr<std::string> c = client::NewLaunchCredential();
          Check(c.status());
          return *c;
        },
        "A new launch credential: 128 bits from the kernel's random source as 32 hex "
        "digits. World rank 0 makes it and broadcasts it (spgate.torch.agree_on_launch).");
  m.def("read_worker_token_file",
        [](const std::string& path) {
          absl::StatusOr<std::string> token = client::ReadWorkerTokenFile(path, "worker_token_file");
          Check(token.status());
          return *token;
        },
        py::arg("path"),
        "The token to send from a worker token file, as every client reads it: the first "
        "credential line's first field, only the part after NAME: (docs/security.md). "
        "InvalidArgumentError naming the file when it is unreadable or holds none.");
  m.def("launch_credential_from_environment", &client::LaunchCredentialFromEnvironment,
        "SPGATE_LAUNCH_CREDENTIAL, or \"\" when unset.");
  m.def("incarnation_from_environment", &client::IncarnationFromEnvironment,
        "The launcher's run identity (SPGATE_INCARNATION, TORCHELASTIC_RUN_ID with the "
        "restart count, Slurm's job id, the MPI job), or \"\" when there is none: what "
        "Client(incarnation=\"\") uses.");
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
