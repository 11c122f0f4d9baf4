// spgate.Client: the binding of client::GateClient (worker/client/gate_client.h), its
// keyword arguments built from the client's option table (worker/client/client_options.h),
// tls= checked by worker/client/tls.h; and the launch identity helpers (launch credential,
// incarnation, job id, worker token file) every client uses.
//
// Invariant: no call holds the GIL while it may wait - await_decision, flush,
// wait_until_connected, close and _cxx_step_loop release it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
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

}  // namespace

void BindClient(py::module_& m) {
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
