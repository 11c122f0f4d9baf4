// spgate.Client: the binding of client::GateClient (worker/client/gate_client.h), its
// keyword arguments built from the client's option table (worker/client/client_options.h),
// tls= checked by worker/client/tls.h; and the launch identity helpers (launch credential,
// incarnation, job id, worker token file) every client uses.
//
// Invariant: no call holds the GIL while it may wait - await_decision, flush,
// wait_until_connected, close and _cxx_step_loop release it - and none finds the client
// destroyed under it: each holds it while it runs (Client::Get), and close wakes their
// waits and destroys it only once they are done (python/bindings.h).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <grpcpp/security/credentials.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "policy/gate_config.h"
#include "python/bindings.h"
#include "worker/client/client_options.h"
#include "worker/client/gate_client.h"
#include "worker/client/identity.h"
#include "worker/client/tls.h"

namespace spgate::python {
namespace {

// The keys tls= takes: spgate-worker's --tls_ca / --tls_cert / --tls_key / --tls_server_name.
constexpr std::array<const char*, 4> kTlsKeys = {"ca", "cert", "key", "server_name"};

std::string TypeName(const py::handle& value) { return Py_TYPE(value.ptr())->tp_name; }

// tls.<key> of a dict or an object with attributes: "" when absent or None, a str, or for
// the PEM files' paths an os.PathLike; InvalidArgumentError naming tls.<key> otherwise.
std::string TlsSetting(const py::object& tls, const char* key) {
  py::object value = py::none();
  if (py::isinstance<py::dict>(tls)) {
    py::dict d = tls.cast<py::dict>();
    if (d.contains(key)) value = d[key];
  } else if (py::hasattr(tls, key)) {
    value = tls.attr(key);
  }
  if (value.is_none()) return "";
  const bool path = std::string_view(key) != "server_name";
  if (path && !py::isinstance<py::str>(value) && py::hasattr(value, "__fspath__")) {
    value = py::module_::import("os").attr("fspath")(value);
  }
  if (!py::isinstance<py::str>(value)) {
    Raise(absl::InvalidArgumentError(absl::StrCat(
        "tls.", key, ": must be ", path ? "a path (str or os.PathLike)" : "a str",
        " or None, got ", TypeName(value))));
  }
  return value.cast<std::string>();
}

// tls= is a dict of kTlsKeys, or an object with those attributes (and no other public
// data attributes): a misspelt key must not leave a certificate out in silence.
void CheckTlsKeys(const py::object& tls) {
  auto known = [](const std::string& name) {
    for (const char* k : kTlsKeys) {
      if (name == k) return true;
    }
    return false;
  };
  const std::string expected = "ca, cert, key, server_name";
  py::dict entries;
  if (py::isinstance<py::dict>(tls)) {
    entries = tls.cast<py::dict>();
  } else if (py::isinstance<py::str>(tls) || py::isinstance<py::bytes>(tls) ||
             PyNumber_Check(tls.ptr()) || py::isinstance<py::sequence>(tls)) {
    Raise(absl::InvalidArgumentError(absl::StrCat(
        "tls: must be None, a dict or an object with attributes ", expected, "; got ",
        TypeName(tls))));
  } else {
    if (py::hasattr(tls, "__dict__")) entries = py::dict(tls.attr("__dict__"));
    bool any = false;
    for (const char* k : kTlsKeys) any = any || py::hasattr(tls, k);
    if (!any) {
      Raise(absl::InvalidArgumentError(absl::StrCat(
          "tls: a value of type ", TypeName(tls), " with none of the attributes ", expected)));
    }
  }
  for (auto [name, value] : entries) {
    if (!py::isinstance<py::str>(name)) {
      Raise(absl::InvalidArgumentError(
          absl::StrCat("tls: keys are str (", expected, "), got a ", TypeName(name))));
    }
    const std::string n = name.cast<std::string>();
    if (known(n)) continue;
    // An object's own machinery (a class's __module__, its methods) is not a setting.
    const bool machinery = n.empty() || n[0] == '_' || PyCallable_Check(value.ptr()) ||
                           PyObject_TypeCheck(value.ptr(), &PyStaticMethod_Type) ||
                           PyObject_TypeCheck(value.ptr(), &PyClassMethod_Type);
    if (!py::isinstance<py::dict>(tls) && machinery) continue;
    Raise(absl::InvalidArgumentError(
        absl::StrCat("tls: unknown key \"", n, "\" (it takes ", expected, ")")));
  }
}

// tls: None (plaintext), or a dict / object with ca, cert, key (PEM paths) and
// server_name - spgate-worker's --tls_ca / --tls_cert / --tls_key / --tls_server_name,
// checked by the same helper (worker/client/tls.h). A tls= without ca or cert still
// means TLS, trusting the system's roots.
void ApplyTls(const py::object& given, GateClientOptions* o) {
  if (given.is_none()) return;
  // Any mapping reads as a dict, a namedtuple by its fields (it is a sequence too).
  py::object tls = given;
  if (!py::isinstance<py::dict>(tls) &&
      py::isinstance(tls, py::module_::import("collections.abc").attr("Mapping"))) {
    tls = py::dict(tls);
  } else if (py::isinstance<py::tuple>(tls) && py::hasattr(tls, "_asdict")) {
    tls = py::dict(tls.attr("_asdict")());
  }
  CheckTlsKeys(tls);
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

void SubmitPlan(Client& self, const BatchPlan& plan) {
  std::vector<client::MicrobatchPlanInput> mbs;
  Check(self.Get("submit_plan")->SubmitPlan(plan.Input(mbs)));
}

GateDecision AwaitDecision(Client& self, int64_t step, std::optional<double> timeout) {
  const std::shared_ptr<GateClient> c = self.Get("await_decision");
  absl::Time deadline = absl::Now() + (timeout ? Seconds(*timeout, "timeout")
                                               : c->options().decision_deadline);
  absl::StatusOr<GateDecision> d;
  {
    py::gil_scoped_release release;
    d = c->AwaitDecision(step, deadline);
  }
  Check(d.status());
  return *d;
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

// A row's default as Python passes it (a duration in seconds).
template <size_t I>
PythonType<PythonRow(I).type> PythonDefault() {
  constexpr const client::ClientOption& row = PythonRow(I);
  using Cxx = typename client::ClientOptionCxx<row.type>::type;
  static const GateClientOptions kDefaults;
  const Cxx& def = client::ClientOptionRef<Cxx>(kDefaults, row);
  if constexpr (row.type == client::ClientOptionType::kDuration) {
    return absl::ToDoubleSeconds(def);
  } else {
    return def;
  }
}

// py::arg(name) = the table's default, or a bare py::arg for the one required keyword.
template <size_t I>
auto PythonArg() {
  constexpr const client::ClientOption& row = PythonRow(I);
  if constexpr (row.name == kRequiredInPython) {
    return py::arg(row.name.data());
  } else {
    return py::arg(row.name.data()) = PythonDefault<I>();
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

// ---- a call the typed signature refused ---------------------------------------------------
//
// pybind11's own TypeError for a call no signature takes ends with "Invoked with: kwargs:"
// and every value, launch_credential and worker_token among them. Client(...) therefore
// has a second __init__(*args, **kwargs) that takes the calls the typed one refused: it
// converts each keyword as pybind11 does (conversions allowed: an int for a float of
// seconds), so a call it can convert builds the client through the same function, and a
// call it cannot raises TypeError naming the keyword and the types, never a value.

[[noreturn]] void ClientTypeError(const std::string& message) {
  throw py::type_error("Client(): " + message);
}

const char* PythonTypeName(client::ClientOptionType type) {
  switch (type) {
    case client::ClientOptionType::kText: return "a str";
    case client::ClientOptionType::kInt: return "an int (32 bits)";
    case client::ClientOptionType::kUint64: return "an int >= 0";
    case client::ClientOptionType::kReal: return "a float";
    case client::ClientOptionType::kFlag: return "a bool";
    case client::ClientOptionType::kDuration: return "a number of seconds";
  }
  return "?";
}

// The keywords Client takes besides the table's rows, in signature order.
constexpr std::array<const char*, 4> kExtraKeywords = {"layout", "coordinates", "sp_required",
                                                      "tls"};

// Positional arguments, an unknown keyword and a missing job_id, named; then each
// keyword's value is converted by ClientKeyword.
void CheckClientCall(const py::args& args, const py::kwargs& kwargs) {
  std::vector<std::string> names;
  for (size_t i : kPythonOptions) names.emplace_back(client::kClientOptions[i].name);
  for (const char* k : kExtraKeywords) names.emplace_back(k);
  if (!args.empty()) {
    ClientTypeError(absl::StrCat("takes keyword arguments only (job_id=..., controller=..., ...), "
                                 "got ", args.size(), " positional"));
  }
  for (auto [key, value] : kwargs) {
    const std::string name = py::str(key);
    if (std::find(names.begin(), names.end(), name) != names.end()) continue;
    py::list close = py::module_::import("difflib").attr("get_close_matches")(name, names, 1);
    ClientTypeError(absl::StrCat("unknown keyword argument '", name, "'",
                                 close.empty() ? ""
                                               : absl::StrCat("; did you mean '",
                                                              close[0].cast<std::string>(), "'?")));
  }
  if (!kwargs.contains(std::string(kRequiredInPython))) {
    ClientTypeError(absl::StrCat("missing the required keyword argument ",
                                 std::string(kRequiredInPython)));
  }
}

// kwargs[name] as T (absent: `def`), or TypeError naming name and `expected`.
template <typename T>
T ClientKeyword(const py::kwargs& kwargs, const char* name, const char* expected, T def) {
  if (!kwargs.contains(name)) return def;
  py::object value = kwargs[name];
  try {
    return value.cast<T>();
  } catch (const py::cast_error&) {
    // An int outside the option's range has the right type: InvalidArgumentError showing
    // the value (no int option is a secret), not a TypeError that says it got an int.
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      if (PyLong_Check(value.ptr()) && !PyBool_Check(value.ptr())) {
        Raise(absl::InvalidArgumentError(absl::StrCat(
            name, ": ", std::string(py::str(value)), " is out of the ",
            std::is_signed_v<T> ? "" : "unsigned ", sizeof(T) * 8, "-bit range [",
            std::numeric_limits<T>::min(), ", ", std::numeric_limits<T>::max(), "]")));
      }
    }
    ClientTypeError(absl::StrCat(name, " must be ", expected, ", got ", TypeName(value)));
  }
}

template <size_t I>
PythonType<PythonRow(I).type> ClientRowKeyword(const py::kwargs& kwargs) {
  constexpr const client::ClientOption& row = PythonRow(I);
  return ClientKeyword(kwargs, row.name.data(), PythonTypeName(row.type), PythonDefault<I>());
}

// Client(*, <every Python row of the table>, tls=None): one keyword per row, typed and
// defaulted by the table, so the signature pybind11 reports is the table's; and the
// second __init__ above for the calls it refuses.
template <size_t... I>
void DefClientInit(py::class_<Client>& cls, std::index_sequence<I...>) {
  auto make = [](PythonType<PythonRow(I).type>... values, std::optional<JobLayout> layout,
                 std::optional<StageCoordinates> coordinates,
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
    // never made here, where it could not reach the other ranks. A bad one from the
    // variable is named by the variable, as spgate-worker names it.
    if (o.launch_credential.empty()) {
      o.launch_credential = client::LaunchCredentialFromEnvironment();
      if (!o.controller.empty() && !o.launch_credential.empty()) {
        Check(CheckLaunchCredential(o.launch_credential,
                                    "environment variable SPGATE_LAUNCH_CREDENTIAL: "
                                    "launch_credential"));
      }
    }
    ApplyTls(tls, &o);
    return std::make_unique<Client>(std::move(o));
  };
  cls.def(py::init(make), py::kw_only(), PythonArg<I>()..., py::arg("layout") = py::none(),
          py::arg("coordinates") = py::none(),
          py::arg("sp_required") = std::vector<std::string>{}, py::arg("tls") = py::none());
  cls.def(py::init([make](const py::args& args, const py::kwargs& kwargs) {
    CheckClientCall(args, kwargs);
    // Braces: the keywords are converted in signature order, so the first bad one is named.
    std::tuple<PythonType<PythonRow(I).type>...> values{ClientRowKeyword<I>(kwargs)...};
    auto layout = ClientKeyword<std::optional<JobLayout>>(kwargs, "layout",
                                                          "a JobLayout or None", std::nullopt);
    auto coordinates = ClientKeyword<std::optional<StageCoordinates>>(
        kwargs, "coordinates", "a StageCoordinates or None", std::nullopt);
    auto sp_required = ClientKeyword<std::vector<std::string>>(kwargs, "sp_required",
                                                               "a list of str", {});
    py::object tls = kwargs.contains("tls") ? py::object(kwargs["tls"]) : py::none();
    return std::apply(
        [&](auto&&... v) {
          return make(std::move(v)..., std::move(layout), coordinates, std::move(sp_required),
                      std::move(tls));
        },
        std::move(values));
  }),
          "The keywords above, converted where Python allows (an int for seconds); "
          "otherwise TypeError naming the keyword and the types, never a value.");
}

// The C++ path of bench/python/client_step_bench.py, run on the same Client in the same
// process: SubmitPlan(n + 1) + AwaitDecision(n) + ReportTelemetry(n) timed per call with
// steady_clock (bench/client/client_step_bench.cc's loop); between steps, untimed, a sleep
// of step_us and a yield loop until decision n + 1 has arrived.
py::dict CxxStepLoop(Client& self, int64_t first_step, int warmup, int steps,
                     std::vector<int64_t> lengths, int step_us) {
  const std::shared_ptr<GateClient> held = self.Get("_cxx_step_loop");
  GateClient& c = *held;
  using Clock = std::chrono::steady_clock;
  std::vector<double> submit_ns, await_ns, report_ns;
  int64_t not_from_daemon = 0;
  const bool remote = !c.options().controller.empty();
  {
    py::gil_scoped_release release;
    // Every plan gets one answer: a decision, a late one or a refusal (counting decisions
    // alone stays one short for good after one late or refused plan).
    auto answered = [&c] {
      const client::GateClientStats s = c.stats();
      return s.decisions_received + s.late_decisions + s.plans_rejected;
    };
    const int64_t base_received = answered();
    auto ready = [&](int64_t n) {
      if (step_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(step_us));
      const auto give_up = Clock::now() + std::chrono::seconds(1);
      while (remote && answered() < base_received + (n - first_step) + 1 &&
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

// Client.report_telemetry: a StepTelemetry, or its fields as keywords (as
// GroupDecider.report_telemetry); TypeError naming report_telemetry otherwise.
void ReportTelemetry(Client& self, py::object telemetry, py::kwargs fields) {
  client::StepTelemetryInput t;
  if (telemetry.is_none()) {
    if (py::len(fields) == 0) {
      throw py::type_error(
          "report_telemetry: a spgate.StepTelemetry or its fields as keywords "
          "(step=, mode=, reason=, step_time_s=, ...)");
    }
    try {
      t = py::type::of<client::StepTelemetryInput>()(**fields)
              .cast<client::StepTelemetryInput>();
    } catch (py::error_already_set& e) {
      if (!e.matches(PyExc_TypeError)) throw;
      throw py::type_error(absl::StrCat("report_telemetry: ", e.what()));
    }
  } else if (py::len(fields) > 0) {
    throw py::type_error("report_telemetry: a StepTelemetry or keywords, not both");
  } else if (!py::isinstance<client::StepTelemetryInput>(telemetry)) {
    throw py::type_error(absl::StrCat(
        "report_telemetry: telemetry must be a spgate.StepTelemetry, got ",
        std::string(py::str(py::type::of(telemetry).attr("__name__")))));
  } else {
    t = telemetry.cast<client::StepTelemetryInput>();
  }
  Check(self.Get("report_telemetry")->ReportTelemetry(t));
}

}  // namespace

void BindClient(py::module_& m) {
  py::class_<Client> client_class(m, "Client");
  DefClientInit(client_class, std::make_index_sequence<kPythonOptions.size()>());
  client_class
      .def("submit_plan", &SubmitPlan, py::arg("plan"))
      .def(
          "submit_plan",
          [](Client& self, int64_t step, const Lengths& lengths, uint64_t sp, uint64_t tp,
             uint64_t budget) {
            SubmitPlan(self, BatchPlan{step, lengths.Get("lengths"), sp, tp, budget});
          },
          py::arg("step"), py::arg("lengths"), py::kw_only(),
          py::arg("predicted_peak_bytes_sp") = 0, py::arg("predicted_peak_bytes_tp") = 0,
          py::arg("memory_budget_bytes") = 0)
      .def("await_decision", &AwaitDecision, py::arg("step"), py::arg("timeout") = py::none())
      .def("report_telemetry", &ReportTelemetry, py::arg("telemetry") = py::none())
      .def("observe_group_rs_wait_share",
           [](Client& self, int64_t step, Mode mode, double share) {
             Check(self.Get("observe_group_rs_wait_share")
                       ->ObserveGroupRsWaitShare(step, mode, share));
           },
           py::arg("step"), py::arg("mode"), py::arg("share"))
      .def("flush",
           [](Client& self, double timeout) {
             const std::shared_ptr<GateClient> c = self.Get("flush");
             absl::Duration d = Seconds(timeout, "timeout");
             absl::Status s;
             {
               py::gil_scoped_release release;
               s = c->Flush(d);
             }
             Check(s);
           },
           py::arg("timeout") = 5.0)
      .def("wait_until_connected",
           [](Client& self, double timeout) {
             const std::shared_ptr<GateClient> c = self.Get("wait_until_connected");
             absl::Duration d = Seconds(timeout, "timeout");
             absl::Status s;
             {
               py::gil_scoped_release release;
               s = c->WaitUntilConnected(d);
             }
             Check(s);
           },
           py::arg("timeout"))
      .def("stats", [](Client& self) { return self.Get("stats")->stats(); })
      .def("config_for",
           [](Client& self, int64_t step) {
             client::ScheduledConfig sc = self.Get("config_for")->ConfigFor(step);
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
             for (const auto& l : self.Get("take_decision_latencies")->TakeDecisionLatencies()) {
               out.emplace_back(l.total_s, l.queued_s);
             }
             return out;
           })
      .def_property_readonly("is_leader",
                             [](Client& self) { return self.Get("is_leader")->options().rank_in_group == 0; })
      .def_property_readonly("job_id", [](Client& self) { return self.Get("job_id")->options().job_id; })
      .def_property_readonly("group", [](Client& self) { return self.Get("group")->options().group; })
      .def_property_readonly("rank_in_group",
                             [](Client& self) { return self.Get("rank_in_group")->options().rank_in_group; })
      .def_property_readonly("group_size",
                             [](Client& self) { return self.Get("group_size")->options().group_size; })
      .def_property_readonly("group_session",
                             [](Client& self) { return self.Get("group_session")->options().group_session; })
      .def_property_readonly("closed", &Client::closed)
      .def("close", &Client::Close)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](Client& self, py::args) {
        self.Close();
        return false;
      });

  m.def("_cxx_step_loop", &CxxStepLoop, py::arg("client"), py::arg("first_step"),
        py::arg("warmup"), py::arg("steps"), py::arg("lengths"), py::arg("step_us"),
        "Benchmark helper (bench/python): the C++ client's per-step loop on this client.");
}

void BindIdentity(py::module_& m) {
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
  m.def("job_id_from_environment", &client::JobIdFromEnvironment,
        "SPGATE_JOB_ID, else Slurm's SLURM_JOB_NAME, or \"\" when neither is set: the job id "
        "spgate-worker and spgate.torch.connect use when none is given.");
  m.def("default_hardware_id",
        [](const std::string& detected) { return client::DefaultHardwareId(detected); },
        py::arg("detected") = "",
        "The hardware id a client declares (the learned tables' relaunch key): "
        "SPGATE_HARDWARE_ID when set, else `detected` made valid when not empty, else \"cpu:\" "
        "and the host's CPU model. What Client(hardware_id=\"\") with a controller uses.");
  m.def("gpu_hardware_id", &client::GpuHardwareId, py::arg("name"), py::arg("major"),
        py::arg("minor"), py::arg("total_memory_bytes"),
        "A GPU's hardware id as a CUDA worker makes it: \"<name> sm_<major><minor> <GiB>GiB\".");
  m.def("incarnation_from_environment", &client::IncarnationFromEnvironment,
        "The launcher's run identity (SPGATE_INCARNATION, TORCHELASTIC_RUN_ID with the "
        "restart count, Slurm's job id, the MPI job), or \"\" when there is none: what "
        "Client(incarnation=\"\") uses.");
}

}  // namespace spgate::python
