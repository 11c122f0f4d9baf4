// spgate._spgate's value types: the enums, the pipeline layout (JobLayout,
// StageCoordinates, stage_schedule), the plans (MicrobatchPlan, BatchPlan), the decisions
// (MicrobatchDecision, GateDecision and its 24-byte wire form) and the telemetry
// (MicrobatchTelemetry, StepTelemetry, ClientStats). Names and fields follow C++
// (policy/, worker/client/gate_client.h).
//
// Invariant: plain values - nothing here calls the daemon, takes a lock or releases the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "policy/pipeline_memory.h"
#include "policy/step_plan.h"
#include "python/bindings.h"
#include "worker/client/gate_client.h"
#include "worker/client/group_decider.h"

namespace spgate::python {
namespace {

// JobLayout's schedule as Python spells it: "1f1b" or "interleaved_1f1b" (ScheduleName).
PipelineSchedule ScheduleFromName(const std::string& name) {
  for (PipelineSchedule s : {PipelineSchedule::k1F1B, PipelineSchedule::kInterleaved1F1B}) {
    if (ScheduleName(s) == name) return s;
  }
  Raise(absl::InvalidArgumentError(absl::StrCat(
      "layout.schedule: \"", name, "\" is neither \"1f1b\" nor \"interleaved_1f1b\"")));
}

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
  if (w.status_code != 0) Raise(client::LeaderFailure(w.status_code, w.step));
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

}  // namespace

void BindEnums(py::module_& m) {
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
}

void BindLayout(py::module_& m) {
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
}

void BindPlans(py::module_& m) {
  py::class_<MicrobatchPlan>(m, "MicrobatchPlan")
      .def(py::init([](int id, const Lengths& lengths, uint64_t asp, uint64_t atp,
                       uint64_t wsp, uint64_t wtp) {
             return MicrobatchPlan{id, lengths.Get("lengths"), asp, atp, wsp, wtp};
           }),
           py::arg("id"), py::arg("lengths") = Lengths{py::list()}, py::kw_only(),
           py::arg("activation_sp") = 0, py::arg("activation_tp") = 0,
           py::arg("workspace_sp") = 0, py::arg("workspace_tp") = 0)
      .def_readwrite("id", &MicrobatchPlan::id)
      .def_property(
          "lengths", [](const MicrobatchPlan& p) { return p.lengths; },
          [](MicrobatchPlan& p, const Lengths& l) { p.lengths = l.Get("lengths"); })
      .def_readwrite("activation_sp", &MicrobatchPlan::activation_sp)
      .def_readwrite("activation_tp", &MicrobatchPlan::activation_tp)
      .def_readwrite("workspace_sp", &MicrobatchPlan::workspace_sp)
      .def_readwrite("workspace_tp", &MicrobatchPlan::workspace_tp)
      .def("__repr__", [](const MicrobatchPlan& p) {
        return absl::StrCat("MicrobatchPlan(id=", p.id, ", lengths=<", p.lengths.size(),
                            " sequences>)");
      });

  py::class_<BatchPlan>(m, "BatchPlan")
      .def(py::init([](int64_t step, const Lengths& lengths, uint64_t sp, uint64_t tp,
                       uint64_t budget, std::vector<MicrobatchPlan> microbatches,
                       uint64_t resident) {
             return BatchPlan{step, lengths.Get("lengths"), sp, tp, budget,
                              std::move(microbatches), resident};
           }),
           py::arg("step"), py::arg("lengths") = Lengths{py::list()},
           py::arg("predicted_peak_bytes_sp") = 0, py::arg("predicted_peak_bytes_tp") = 0,
           py::arg("memory_budget_bytes") = 0,
           py::arg("microbatches") = std::vector<MicrobatchPlan>{},
           py::arg("resident_bytes") = 0)
      .def_readwrite("step", &BatchPlan::step)
      .def_property(
          "lengths", [](const BatchPlan& p) { return p.lengths; },
          [](BatchPlan& p, const Lengths& l) { p.lengths = l.Get("lengths"); })
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
}

void BindDecisions(py::module_& m) {
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
}

void BindTelemetry(py::module_& m) {
  py::class_<MicrobatchTelemetryValues>(m, "MicrobatchTelemetry")
      .def(py::init([](int id, Mode mode, double forward_s, double backward_s, double rs_wait_s,
                       double all_gather_s, int64_t effective_tokens, double all_reduce_s) {
             return MicrobatchTelemetryValues{.id = id,
                                              .mode = mode,
                                              .forward_s = forward_s,
                                              .backward_s = backward_s,
                                              .rs_wait_s = rs_wait_s,
                                              .all_gather_s = all_gather_s,
                                              .effective_tokens = effective_tokens,
                                              .all_reduce_s = all_reduce_s};
           }),
           py::arg("id"), py::arg("mode"), py::arg("forward_s"), py::arg("backward_s"),
           py::arg("rs_wait_s") = 0.0, py::arg("all_gather_s") = 0.0,
           py::arg("effective_tokens") = 0, py::arg("all_reduce_s") = 0.0)
      .def_readwrite("id", &MicrobatchTelemetryValues::id)
      .def_readwrite("mode", &MicrobatchTelemetryValues::mode)
      .def_readwrite("forward_s", &MicrobatchTelemetryValues::forward_s)
      .def_readwrite("backward_s", &MicrobatchTelemetryValues::backward_s)
      .def_readwrite("rs_wait_s", &MicrobatchTelemetryValues::rs_wait_s)
      .def_readwrite("all_gather_s", &MicrobatchTelemetryValues::all_gather_s)
      .def_readwrite("effective_tokens", &MicrobatchTelemetryValues::effective_tokens)
      .def_readwrite("all_reduce_s", &MicrobatchTelemetryValues::all_reduce_s)
      .def("__eq__", [](const MicrobatchTelemetryValues& a, const MicrobatchTelemetryValues& b) {
        return a == b;
      });

  py::class_<client::StepTelemetryInput>(m, "StepTelemetry")
      .def(py::init([](int64_t step, Mode mode, Reason reason, double step_time_s, double rs_wait_s,
                       double all_gather_s, double norm_stall_s, int64_t effective_tokens,
                       int64_t padding_tokens, uint64_t peak_memory_bytes,
                       std::vector<MicrobatchTelemetryValues> microbatches,
                       double all_reduce_s) {
             return client::StepTelemetryInput{.step = step,
                                               .mode = mode,
                                               .reason = reason,
                                               .step_time_s = step_time_s,
                                               .rs_wait_s = rs_wait_s,
                                               .all_gather_s = all_gather_s,
                                               .norm_stall_s = norm_stall_s,
                                               .effective_tokens = effective_tokens,
                                               .padding_tokens = padding_tokens,
                                               .peak_memory_bytes = peak_memory_bytes,
                                               .all_reduce_s = all_reduce_s,
                                               .microbatches = std::move(microbatches)};
           }),
           py::arg("step"), py::arg("mode"), py::arg("reason"), py::arg("step_time_s"),
           py::arg("rs_wait_s") = 0.0, py::arg("all_gather_s") = 0.0,
           py::arg("norm_stall_s") = 0.0, py::arg("effective_tokens") = 0,
           py::arg("padding_tokens") = 0, py::arg("peak_memory_bytes") = 0,
           py::arg("microbatches") = std::vector<MicrobatchTelemetryValues>{},
           py::arg("all_reduce_s") = 0.0)
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
      .def_readwrite("peak_memory_bytes", &client::StepTelemetryInput::peak_memory_bytes)
      .def_readwrite("all_reduce_s", &client::StepTelemetryInput::all_reduce_s);

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
      .def_readonly("last_error", &client::GateClientStats::last_error)
      // ClientStats(connected=True, registrations=1, ...): every field bound above (the
      // class's properties, in their order).
      .def("__repr__", [](py::handle self) {
        const py::handle property = reinterpret_cast<PyObject*>(&PyProperty_Type);
        std::string out = "ClientStats(";
        const char* sep = "";
        for (py::handle item : py::type::of(self).attr("__dict__").attr("items")()) {
          const py::tuple kv = py::reinterpret_borrow<py::tuple>(item);
          if (!py::isinstance(kv[1], property)) continue;
          const std::string name = kv[0].cast<std::string>();
          absl::StrAppend(&out, sep, name, "=",
                          py::repr(self.attr(name.c_str())).cast<std::string>());
          sep = ", ";
        }
        return out + ")";
      });
}

}  // namespace spgate::python
