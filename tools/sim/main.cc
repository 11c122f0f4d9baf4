// spgate-sim: simulated TP groups speaking spgate's real protocol (docs/design.md §5).
//
//   spgate-sim --controller=127.0.0.1:50061 --groups=128 --tp=8 --steps_per_s=10
//       --duration=60s --lengths=lognormal:mean=4096,sigma=0.8 --summary_json=out.json
//   spgate-sim replay --config=gates.txtpb --lengths=file:trace.txt [--sweep] [--compare]
//   spgate-sim replay --compare --pp=4 --microbatches=8 [--schedule=interleaved --vp=2]
//
// The first form runs G groups × t ranks against spgated (or, with --controller empty,
// with the local policy only) and checks that every rank of a group ran the same mode at
// every step. `replay` runs the same policy offline over a length trace; with --sweep it
// replays a grid of max_length_cv × max_rs_wait_share and prints the ranking; with --compare
// it runs every fixed choice, the policies and the oracle, per (stage, micro-batch) of a
// pipeline with --pp/--microbatches (tools/sim/pipeline.h). The cost
// model and every flag are described in docs/sim.md. Exit status: 0, or 1 when a run
// saw consistency violations or decision errors, 2 on bad flags.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/internal/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/cli.h"
#include "common/mutex.h"
#include "policy/gate_policy.h"
#include "proto/convert.h"
#include "proto/text_format.h"
#include "tools/sim/compare.h"
#include "tools/sim/compare_plot.h"
#include "tools/sim/sim.h"
#include "worker/client/identity.h"
#include "worker/client/tls_flags.h"

// Shared job flags (docs/design.md §5).
ABSL_FLAG(std::string, controller, "", "spgated worker API address; empty: local policy only");
ABSL_FLAG(std::string, job_id, "",
          "Job id; required with --controller unless SPGATE_JOB_ID is set");
ABSL_FLAG(std::string, incarnation, "",
          "This launch of the simulated job; empty: the launcher's (SPGATE_INCARNATION, ...) "
          "or a new one");
ABSL_FLAG(std::string, lengths, "lognormal:mean=4096,sigma=0.8",
          "Length distribution: lognormal:mean=M,sigma=S | bimodal:short=A,long=B,p_long=P | "
          "uniform:min=A,max=B | file:PATH | shift:after=N|FIRST|THEN (FIRST's first N "
          "lengths, then THEN's)");
ABSL_FLAG(int64_t, tokens_per_batch, 16384, "Tokens per batch (packed sequences)");
ABSL_FLAG(int64_t, steps, 0, "Steps per group (0: --duration x --steps_per_s)");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(30), "Run length when --steps is 0");
ABSL_FLAG(uint64_t, seed, 1, "Random seed");
ABSL_FLAG(std::string, summary_json, "", "Write the JSON summary here (default: stdout)");
ABSL_FLAG(bool, progress, false,
          "A progress line on stderr every 2 s (default: when stderr is a terminal)");
// Simulator flags.
ABSL_FLAG(int, groups, 4, "TP groups");
ABSL_FLAG(int, tp, 8, "Ranks per TP group");
ABSL_FLAG(double, steps_per_s, 10, "Steps per second per group");
ABSL_FLAG(int, threads, 0, "Driver threads (0: min(groups, 2 x cores, 16))");
ABSL_FLAG(std::string, group_phase, "random",
          "When groups tick within the step period: random (each group its own seeded phase) "
          "or aligned (all at once, like one data-parallel job; the daemon's worst burst)");
ABSL_FLAG(absl::Duration, deadline, spgate::sim::SimOptions{}.deadline,
          "Decision deadline per step (the client's decision_deadline)");
ABSL_FLAG(absl::Duration, connect_timeout, absl::Seconds(60),
          "Before the first step, how long to wait for every rank's stream to the daemon");
ABSL_FLAG(absl::Duration, flush_timeout, spgate::sim::SimOptions{}.flush_timeout,
          "After the last step, how long to wait for the daemon to acknowledge every rank's "
          "telemetry (a refused credential ends the wait at once)");
ABSL_FLAG(absl::Duration, telemetry_flush, absl::Milliseconds(250),
          "Batch each rank's telemetry for up to this long (0: with the next write)");
ABSL_FLAG(bool, bucketing, true, "Bucket batches by length (the worker's bucket_by_tokens)");
ABSL_FLAG(bool, leader_group_rs_wait, true,
          "Feed the leader's fallback the group's max wait share (else its own; needs "
          "--group_session=false)");
ABSL_FLAG(bool, group_session, true,
          "The leader's session speaks for its group, telemetry reduced in the group; false: "
          "every simulated rank registers and reports its own (per-rank sessions)");
// Cost model (docs/sim.md).
ABSL_FLAG(int, layers, 8, "Transformer layers on a rank (default: one of 5 pipeline stages of a 13B model)");
ABSL_FLAG(int, hidden, 5120, "Hidden size");
ABSL_FLAG(int, heads, 40,
          "Attention heads: a divisor of --hidden, and for a shape Megatron can run a "
          "multiple of --tp");
ABSL_FLAG(std::string, hardware, spgate::sim::kDefaultHardware,
          "Hardware preset: h100-sxm or h200-sxm (policy/hardware/; the device flags below "
          "default to its values, an explicit flag overrides)");
ABSL_FLAG(double, device_tflops, 0,
          "Peak dense TFLOP/s of a device (0, the default: the --hardware preset's)");
ABSL_FLAG(double, mfu, 0,
          "Achieved fraction of peak on GEMMs (0, the default: the --hardware preset's)");
ABSL_FLAG(double, attention_tflops, 0,
          "Achieved attention TFLOP/s (0, the default: the --hardware preset's)");
ABSL_FLAG(double, hbm_gbps, 0,
          "Achieved device memory bandwidth, GB/s (0, the default: the --hardware preset's)");
ABSL_FLAG(double, link_gbps, 0,
          "Given: every collective is bytes x factor / this GB/s + --collective_latency_us "
          "(a flat link) instead of the preset's measured curves");
ABSL_FLAG(double, collective_latency_us, 0,
          "Per-call cost of the flat link, us (0, the default: the --hardware preset's)");
ABSL_FLAG(bool, nvls, true, "NVLink SHARP all-reduce where the preset's curves have it (TP 8)");
ABSL_FLAG(double, device_memory_gib, 0,
          "Device memory, GiB (the memory gate's budget; 0, the default: the --hardware preset's)");
ABSL_FLAG(std::string, norm_boundary, "shard",
          "Where SP runs LayerNorm: shard (inside the sequence shard) or gather (on the "
          "all-gathered sequence, spgate-worker's legacy path)");
ABSL_FLAG(bool, tp_comm_overlap, false,
          "SP's all-gathers / reduce-scatters overlap the GEMMs (Megatron --tp-comm-overlap)");
ABSL_FLAG(double, norm_passes, spgate::sim::CostParams{}.norm_passes,
          "Element-wise passes of h bf16 values per token and layer in the two add+LayerNorms");
ABSL_FLAG(double, dropout_passes, spgate::sim::CostParams{}.dropout_passes,
          "Element-wise passes of h bf16 values per token and layer in the two bias-dropouts");
ABSL_FLAG(bool, flash_attention, true, "No s x s attention-score activations");
ABSL_FLAG(double, shard_work_fraction, 0,
          "What-if: fraction of attention that runs on the SP rank's own sequence shard "
          "(causal cost per shard; 0: Megatron SP, heads split, balanced)");
ABSL_FLAG(double, jitter, 0.03, "Per-rank per-step noise (sigma, relative)");
ABSL_FLAG(double, straggler_prob, 0.0, "Per-rank per-step probability of a slow rank");
ABSL_FLAG(double, straggler_slowdown, 0.5, "Extra relative time of a slow rank");
ABSL_FLAG(int64_t, straggler_burst_every, 0,
          "Stragglers only in bursts: a burst starts every this many steps (0: always)");
ABSL_FLAG(int64_t, straggler_burst_steps, 0,
          "Length of each straggler burst, in steps (with --straggler_burst_every, below it)");
ABSL_FLAG(bool, adaptive_prior, true,
          "ADAPTIVE's physics prior decides bands without samples (false: the static gates "
          "do, as before it existed)");
ABSL_FLAG(double, switch_cost_s, 0,
          "Seconds a group's mode switch adds to the step it happens on (0: free)");
// Pipelines (replay --compare only; docs/sim.md "Pipelines").
ABSL_FLAG(int, pp, 1, "replay --compare: pipeline stages (--groups are then pipeline replicas, "
          "--layers the layers of one stage)");
ABSL_FLAG(int, microbatches, 1, "replay --compare: micro-batches per optimizer step");
ABSL_FLAG(int, vp, 1,
          "replay --compare: model chunks per stage (>= 2 with --schedule=interleaved)");
ABSL_FLAG(std::string, schedule, "1f1b",
          "replay --compare: pipeline schedule, 1f1b or interleaved (printed as "
          "interleaved_1f1b)");
ABSL_FLAG(int, vocab, 51200, "Vocabulary (the first stage's embedding, the last's output layer)");
ABSL_FLAG(double, p2p_gbps, 50, "Stage-to-stage bandwidth per rank, GB/s");
// replay.
ABSL_FLAG(std::string, config, "", "replay: GateConfig in protobuf text format");
ABSL_FLAG(bool, sweep, false, "replay: sweep max_length_cv x max_rs_wait_share");
ABSL_FLAG(std::string, sweep_max_length_cv, "0.05:0.5:0.05", "replay --sweep: lo:hi:step");
ABSL_FLAG(std::string, sweep_max_rs_wait_share, "0.1:0.4:0.05", "replay --sweep: lo:hi:step");
ABSL_FLAG(bool, compare, false,
          "replay: the same batches and noise under sp, tp_only, static, adaptive, the "
          "per-batch oracle and the expected-value oracle (JSON key compare)");
ABSL_FLAG(std::string, compare_series, "", "replay --compare: write tokens/s per window as CSV");
ABSL_FLAG(std::string, compare_batches, "",
          "replay --compare: write every (group, step, stage, micro-batch)'s length statistics "
          "and both modes' seconds, noise-free and drawn, as CSV");
ABSL_FLAG(std::string, plot, "",
          "replay --compare: draw tokens/s per window and each group's modes into this .png "
          "(.svg, .pdf) with python3-matplotlib (tools/sim/plot_compare.py)");
ABSL_FLAG(int64_t, compare_window, 0, "replay --compare: steps per series point (0: steps/50)");
ABSL_FLAG(int64_t, regret_window, spgate::sim::kDefaultRegretWindow,
          "replay --compare: steps per window of the windowed regret against the oracle "
          "(sliding by one step; a shorter run is one window)");

namespace {

using spgate::sim::SimOptions;

SimOptions OptionsFromFlags() {
  SimOptions o;
  o.controller = absl::GetFlag(FLAGS_controller);
  o.tls = spgate::client::TlsOptionsFromFlags();
  o.worker_token_file = spgate::client::WorkerTokenFileFromFlags();
  o.job_id = absl::GetFlag(FLAGS_job_id);
  if (o.job_id.empty()) o.job_id = spgate::client::JobIdFromEnvironment();
  o.incarnation = absl::GetFlag(FLAGS_incarnation);
  o.lengths = absl::GetFlag(FLAGS_lengths);
  o.tokens_per_batch = absl::GetFlag(FLAGS_tokens_per_batch);
  o.bucketing = absl::GetFlag(FLAGS_bucketing);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.duration = absl::GetFlag(FLAGS_duration);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.groups = absl::GetFlag(FLAGS_groups);
  o.steps_per_s = absl::GetFlag(FLAGS_steps_per_s);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.deadline = absl::GetFlag(FLAGS_deadline);
  o.connect_timeout = absl::GetFlag(FLAGS_connect_timeout);
  o.flush_timeout = absl::GetFlag(FLAGS_flush_timeout);
  o.telemetry_flush = absl::GetFlag(FLAGS_telemetry_flush);
  o.leader_group_rs_wait = absl::GetFlag(FLAGS_leader_group_rs_wait);
  o.group_session = absl::GetFlag(FLAGS_group_session);
  spgate::sim::CostParams& c = o.cost;
  c.tp = absl::GetFlag(FLAGS_tp);
  c.layers = absl::GetFlag(FLAGS_layers);
  c.hidden = absl::GetFlag(FLAGS_hidden);
  c.heads = absl::GetFlag(FLAGS_heads);
  c.nvls = absl::GetFlag(FLAGS_nvls);
  c.tp_comm_overlap = absl::GetFlag(FLAGS_tp_comm_overlap);
  c.norm_passes = absl::GetFlag(FLAGS_norm_passes);
  c.dropout_passes = absl::GetFlag(FLAGS_dropout_passes);
  c.flash_attention = absl::GetFlag(FLAGS_flash_attention);
  c.shard_work_fraction = absl::GetFlag(FLAGS_shard_work_fraction);
  c.jitter = absl::GetFlag(FLAGS_jitter);
  c.straggler_prob = absl::GetFlag(FLAGS_straggler_prob);
  c.straggler_slowdown = absl::GetFlag(FLAGS_straggler_slowdown);
  c.straggler_burst_every = absl::GetFlag(FLAGS_straggler_burst_every);
  c.straggler_burst_steps = absl::GetFlag(FLAGS_straggler_burst_steps);
  c.vocab = absl::GetFlag(FLAGS_vocab);
  c.p2p_gbps = absl::GetFlag(FLAGS_p2p_gbps);
  c.switch_cost_s = absl::GetFlag(FLAGS_switch_cost_s);
  o.pp = absl::GetFlag(FLAGS_pp);
  o.vp = absl::GetFlag(FLAGS_vp);
  o.microbatches = absl::GetFlag(FLAGS_microbatches);
  o.adaptive_prior = absl::GetFlag(FLAGS_adaptive_prior);
  o.progress = spgate::ProgressWanted(absl::GetFlag(FLAGS_progress),
                                      absl::flags_internal::WasPresentOnCommandLine("progress"));
  return o;
}

// Whether the flag was on the command line (CommandLineFlag::IsSpecifiedOnCommandLine is
// private in the Abseil this builds with; this is what it calls).
template <typename Flag>
bool given(const Flag& flag) {
  return absl::flags_internal::WasPresentOnCommandLine(absl::GetFlagReflectionHandle(flag).Name());
}

// A TP degree past the preset's largest measured curve uses that curve (HardwarePreset::
// Curve): the tables measure one node's NVLink, so a group across nodes is modelled as if
// it were inside one. Said on stderr, once, before the run.
void WarnBeyondTheCurves(const spgate::sim::CostParams& c) {
  if (c.flat_link || c.tp <= 1) return;
  absl::StatusOr<const spgate::HardwarePreset*> hw = spgate::FindHardwarePreset(c.hardware);
  if (!hw.ok()) return;
  int largest = 0;
  for (const auto& [key, curve] : (*hw)->curves) largest = std::max(largest, key.tp);
  if (c.tp > largest) {
    std::fprintf(stderr,
                 "spgate-sim: note: --hardware=%s's collective curves are measured up to %d "
                 "ranks (one node's NVLink); --tp=%d uses the %d-rank curves, as if the group "
                 "were inside one node (give --link_gbps for a flat link)\n",
                 c.hardware.c_str(), largest, c.tp, largest);
  }
}

// Heads that do not split over the TP ranks (ValidateCostParams refuses them where the
// model counts heads per rank, without flash attention): with flash attention no term of
// the model reads the head count, so the run goes on, said on stderr, once.
void WarnHeadsNotSplit(const spgate::sim::CostParams& c) {
  if (!c.flash_attention || c.heads % c.tp == 0) return;
  std::fprintf(stderr,
               "spgate-sim: note: --heads=%d is not divisible by --tp=%d: Megatron's TP could "
               "not split the heads; with flash attention no term of the cost model reads "
               "them, so the run goes on (give --heads a multiple of --tp for a real shape)\n",
               c.heads, c.tp);
}

// The --hardware preset's device constants, then each device flag given on the command
// line over it (an explicit --link_gbps makes the link flat), then the norm boundary.
absl::Status ApplyHardwareFlags(spgate::sim::CostParams& c) {
  absl::StatusOr<const spgate::HardwarePreset*> hw =
      spgate::FindHardwarePreset(absl::GetFlag(FLAGS_hardware));
  if (!hw.ok()) return absl::InvalidArgumentError(absl::StrCat("--hardware: ", hw.status().message()));
  const bool nvls = c.nvls;
  spgate::sim::ApplyHardwarePreset(**hw, c);
  c.nvls = nvls && (*hw)->nvls;
  if (given(FLAGS_device_tflops)) c.device_tflops = absl::GetFlag(FLAGS_device_tflops);
  if (given(FLAGS_mfu)) c.mfu = absl::GetFlag(FLAGS_mfu);
  if (given(FLAGS_attention_tflops)) c.attention_tflops = absl::GetFlag(FLAGS_attention_tflops);
  if (given(FLAGS_hbm_gbps)) c.hbm_gbps = absl::GetFlag(FLAGS_hbm_gbps);
  if (given(FLAGS_device_memory_gib)) c.device_memory_gib = absl::GetFlag(FLAGS_device_memory_gib);
  if (given(FLAGS_collective_latency_us)) {
    c.collective_latency_us = absl::GetFlag(FLAGS_collective_latency_us);
  }
  if (given(FLAGS_link_gbps)) {
    c.link_gbps = absl::GetFlag(FLAGS_link_gbps);
    c.flat_link = true;
  }
  absl::StatusOr<spgate::sim::NormBoundary> norm =
      spgate::sim::ParseNormBoundary(absl::GetFlag(FLAGS_norm_boundary));
  if (!norm.ok()) return norm.status();
  c.norm_boundary = *norm;
  return spgate::sim::ValidateCostParams(c);
}

absl::StatusOr<spgate::GateConfig> LoadConfig(const std::string& path) {
  if (path.empty()) return spgate::GateConfig{};
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--config: cannot open ", path));
  std::stringstream text;
  text << in.rdbuf();
  spgate::v1::GateConfig layer;
  if (absl::Status s = spgate::ParseTextFormat(text.str(), &layer); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--config: ", path, ": ", s.message()));
  }
  spgate::GateConfig c = spgate::LayerGateConfig(spgate::GateConfig{}, layer);
  if (absl::Status s = spgate::ValidateGateConfig(c); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--config: ", path, ": ", s.message()));
  }
  return c;
}

void PrintHuman(const spgate::sim::Summary& s) {
  using spgate::sim::CountText;
  std::fprintf(stderr, "spgate-sim %s: %s x %s, %s each, %.2f s wall, %s\n", s.command.c_str(),
               CountText(s.groups, "group").c_str(), CountText(s.tp, "rank").c_str(),
               CountText(s.steps, "step").c_str(), s.wall_s,
               CountText(s.threads, "thread").c_str());
  for (const auto& [mode, reasons] : s.decisions) {
    for (const auto& [reason, n] : reasons) {
      std::fprintf(stderr, "  %-8s %-24s %lld\n", mode.c_str(), reason.c_str(),
                   static_cast<long long>(n));
    }
  }
  std::fprintf(stderr,
               "  local decisions %lld, memory overrides %lld, consistency violations %lld, "
               "decision errors %lld, lost telemetry %lld of %lld\n",
               static_cast<long long>(s.local_decisions),
               static_cast<long long>(s.memory_overrides),
               static_cast<long long>(s.consistency_violations),
               static_cast<long long>(s.decide_errors),
               static_cast<long long>(s.telemetry_reported - s.telemetry_acked),
               static_cast<long long>(s.telemetry_reported));
  if (!s.decision_latency_s.empty()) {
    std::fprintf(stderr, "  decision latency (leaders) p50 %.3f ms, p99 %.3f ms, max %.3f ms\n",
                 1e3 * spgate::sim::Percentile(s.decision_latency_s, 0.5),
                 1e3 * spgate::sim::Percentile(s.decision_latency_s, 0.99),
                 1e3 * spgate::sim::Percentile(s.decision_latency_s, 1.0));
    std::fprintf(stderr,
                 "    queued in this process before the write p50 %.3f ms, p99 %.3f ms; "
                 "from the write p50 %.3f ms, p99 %.3f ms\n",
                 1e3 * spgate::sim::Percentile(s.plan_queued_s, 0.5),
                 1e3 * spgate::sim::Percentile(s.plan_queued_s, 0.99),
                 1e3 * spgate::sim::Percentile(s.from_write_s, 0.5),
                 1e3 * spgate::sim::Percentile(s.from_write_s, 0.99));
  }
  if (!s.first_error.empty()) std::fprintf(stderr, "  first error: %s\n", s.first_error.c_str());
}

// `started`: when the command's work began (after the flag checks); the summary's wall_s
// runs from there to here, so it covers a replay's --sweep and --compare (and --plot), and
// a live run's connecting and final flush, as a reader timing the command counts them.
int Emit(spgate::sim::Summary& s, absl::Time started) {
  s.wall_s = absl::ToDoubleSeconds(absl::Now() - started);
  PrintHuman(s);
  const std::string json = s.ToJson();
  const std::string path = absl::GetFlag(FLAGS_summary_json);
  if (path.empty()) {
    std::cout << json;
  } else {
    std::ofstream out(path);
    out << json;
    if (!out) {
      std::fprintf(stderr, "spgate-sim: cannot write %s\n", path.c_str());
      return 2;
    }
  }
  return s.consistency_violations > 0 || s.decide_errors > 0 ? 1 : 0;
}

// --plot's figure of the comparison (compare_plot.h); 2 if it cannot be drawn.
int Plot(const spgate::sim::CompareResult& r) {
  const std::string path = absl::GetFlag(FLAGS_plot);
  if (path.empty()) return 0;
  if (absl::Status s = spgate::sim::WriteComparePlot(r, path); !s.ok()) {
    std::fprintf(stderr, "spgate-sim: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  return 0;
}

// A comparison's outputs beyond the table: its JSON in the summary, --compare_series and
// --plot. 2 if a file cannot be written.
int CompareOutputs(const spgate::sim::CompareResult& r, spgate::sim::Summary& s) {
  s.extra_json["compare"] = spgate::sim::CompareJson(r);
  const std::string series = absl::GetFlag(FLAGS_compare_series);
  if (!series.empty()) {
    std::ofstream out(series);
    out << spgate::sim::CompareSeriesCsv(r);
    if (!out) {
      std::fprintf(stderr, "spgate-sim: cannot write --compare_series=%s\n", series.c_str());
      return 2;
    }
  }
  return Plot(r);
}

// Compare with the flags' windows, writing --compare_batches as the batches are drawn.
absl::StatusOr<spgate::sim::CompareResult> RunCompare(const SimOptions& o,
                                                      const spgate::GateConfig& config) {
  const std::string path = absl::GetFlag(FLAGS_compare_batches);
  std::ofstream out;
  spgate::sim::BatchSink sink;
  if (!path.empty()) {
    out.open(path);
    if (!out) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot open --compare_batches=", path, ": ", std::strerror(errno)));
    }
    out << spgate::sim::kBatchCsvHeader;
    sink = [&out](const spgate::sim::BatchRecord& b) {
      out << spgate::sim::CompareBatchesCsvRow(b);
    };
  }
  absl::StatusOr<spgate::sim::CompareResult> r =
      spgate::sim::Compare(o, config, absl::GetFlag(FLAGS_compare_window),
                           absl::GetFlag(FLAGS_regret_window), sink);
  if (r.ok() && !path.empty() && !out.flush()) {
    return absl::InternalError(
        absl::StrCat("cannot write --compare_batches=", path, ": ", std::strerror(errno)));
  }
  return r;
}

// `replay --compare` of a pipeline: the summary's top-level keys are the static policy's
// (what plain replay reports without a pipeline), decisions per (stage, micro-batch).
int ReplayPipeline(const SimOptions& o, const spgate::GateConfig& config, absl::Time started) {
  absl::StatusOr<spgate::sim::CompareResult> r = RunCompare(o, config);
  if (!r.ok()) {
    std::fprintf(stderr, "spgate-sim: %s\n", r.status().ToString().c_str());
    return 2;
  }
  std::fprintf(stderr, "\n%s\n", spgate::sim::CompareTable(*r).c_str());
  const spgate::sim::PolicyResult& st = *r->Find("static");
  spgate::sim::Summary s;
  s.command = "replay";
  s.steps = r->steps;
  s.groups = o.groups;
  s.tp = o.cost.tp;
  s.threads = 1;
  s.config_json = spgate::sim::GateConfigJson(config, 0);
  s.decisions = st.decisions;
  s.all.steps = r->steps * o.groups;
  s.all.tokens = st.tokens;
  s.all.time_s = st.time_s;
  s.all.step_times = st.step_times;
  s.all.peak_memory = st.peak_memory_bytes;
  if (int rc = CompareOutputs(*r, s); rc != 0) return rc;
  return Emit(s, started);
}

// The flag checks and parses every run needs, before it starts (so a long replay does not
// end in a flag error or without its figure). 0, or the exit status after the message.
int CheckFlags(bool replay, SimOptions& o) {
  const auto fail = [](absl::string_view message) {
    std::fprintf(stderr, "spgate-sim: %s\n", std::string(message).c_str());
    return 2;
  };
  if (absl::Status s = spgate::sim::ValidateRunShape(o); !s.ok()) return fail(s.message());
  const bool compare = replay && absl::GetFlag(FLAGS_compare);
  // A flag that belongs to a mode not asked for would be ignored without a word.
  for (const auto& [flag, value] :
       {std::pair("compare_series", absl::GetFlag(FLAGS_compare_series)),
        std::pair("compare_batches", absl::GetFlag(FLAGS_compare_batches))}) {
    if (!value.empty() && !compare) {
      return fail(absl::StrCat("--", flag, " belongs to `spgate-sim replay --compare`"));
    }
  }
  if ((given(FLAGS_sweep_max_length_cv) || given(FLAGS_sweep_max_rs_wait_share)) &&
      !(replay && absl::GetFlag(FLAGS_sweep))) {
    return fail("--sweep_max_length_cv and --sweep_max_rs_wait_share belong to "
                "`spgate-sim replay --sweep`");
  }
  if (absl::GetFlag(FLAGS_compare_window) < 0) {
    return fail(absl::StrCat("--compare_window must be >= 0 steps (0: steps/50), got ",
                             absl::GetFlag(FLAGS_compare_window)));
  }
  // Output files are checked before the run, so a long one does not end in the error.
  for (const auto& [flag, path] :
       {std::pair("summary_json", absl::GetFlag(FLAGS_summary_json)),
        std::pair("compare_series", absl::GetFlag(FLAGS_compare_series)),
        std::pair("compare_batches", absl::GetFlag(FLAGS_compare_batches))}) {
    if (absl::Status s = spgate::sim::CheckOutputFolder(flag, path); !s.ok()) {
      return fail(s.message());
    }
  }
  if (const std::string plot = absl::GetFlag(FLAGS_plot); !plot.empty()) {
    if (!replay || !absl::GetFlag(FLAGS_compare)) {
      std::fprintf(stderr, "spgate-sim: --plot belongs to `spgate-sim replay --compare`\n");
      return 2;
    }
    if (absl::Status s = spgate::sim::CheckComparePlot(plot); !s.ok()) {
      std::fprintf(stderr, "spgate-sim: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  if (absl::GetFlag(FLAGS_regret_window) < 1) {
    std::fprintf(stderr, "spgate-sim: --regret_window must be >= 1 step, got %lld\n",
                 static_cast<long long>(absl::GetFlag(FLAGS_regret_window)));
    return 2;
  }
  if (absl::Status s = ApplyHardwareFlags(o.cost); !s.ok()) {
    std::fprintf(stderr, "spgate-sim: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  WarnBeyondTheCurves(o.cost);
  WarnHeadsNotSplit(o.cost);
  absl::StatusOr<SimOptions::GroupPhase> phase =
      spgate::sim::ParseGroupPhase(absl::GetFlag(FLAGS_group_phase));
  if (!phase.ok()) {
    std::fprintf(stderr, "spgate-sim: %s\n", std::string(phase.status().message()).c_str());
    return 2;
  }
  o.group_phase = *phase;
  absl::StatusOr<spgate::PipelineSchedule> schedule =
      spgate::sim::ParseSchedule(absl::GetFlag(FLAGS_schedule));
  if (!schedule.ok()) {
    std::fprintf(stderr, "spgate-sim: %s\n", std::string(schedule.status().message()).c_str());
    return 2;
  }
  o.schedule = *schedule;
  if (o.pipelined() && (!replay || !absl::GetFlag(FLAGS_compare) || absl::GetFlag(FLAGS_sweep))) {
    std::fprintf(stderr,
                 "spgate-sim: --pp/--vp/--microbatches: pipelines are simulated by "
                 "`spgate-sim replay --compare` only (no --sweep)\n");
    return 2;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  spgate::DisableMutexDeadlockDetection();
  spgate::InitFlagsUsage("spgate-sim");
  absl::SetProgramUsageMessage(
      "simulated TP groups speaking spgate's protocol.\n"
      "  spgate-sim [--controller=ADDR] --groups=G --tp=T --steps_per_s=R --duration=60s ...\n"
      "  spgate-sim replay --config=FILE --lengths=file:TRACE [--sweep] [--compare]\n"
      "  spgate-sim replay --compare --pp=P --microbatches=M [--schedule=interleaved --vp=V]\n"
      "See docs/sim.md.");
  bool replay = false;
  std::vector<char*> args(argv, argv + argc);
  if (argc > 1 && std::string(argv[1]) == "replay") {
    replay = true;
    args.erase(args.begin() + 1);
  }
  std::vector<char*> rest = spgate::ParseFlags(static_cast<int>(args.size()), args.data());
  if (rest.size() > 1) {
    std::fprintf(stderr,
                 "spgate-sim: unexpected argument \"%s\" (the one subcommand, replay, comes "
                 "first: spgate-sim replay --flags...)\n",
                 rest[1]);
    return 2;
  }
  SimOptions o = OptionsFromFlags();
  if (int rc = CheckFlags(replay, o); rc != 0) return rc;
  const absl::Time started = absl::Now();
  if (!replay) {
    if (!absl::GetFlag(FLAGS_config).empty() || absl::GetFlag(FLAGS_sweep) ||
        absl::GetFlag(FLAGS_compare)) {
      std::fprintf(stderr,
                   "spgate-sim: --config, --sweep and --compare belong to `spgate-sim replay`\n");
      return 2;
    }
    absl::StatusOr<spgate::sim::Summary> s = spgate::sim::RunLive(o);
    if (!s.ok()) {
      std::fprintf(stderr, "spgate-sim: %s\n", s.status().ToString().c_str());
      return 2;
    }
    return Emit(*s, started);
  }
  absl::StatusOr<spgate::GateConfig> config = LoadConfig(absl::GetFlag(FLAGS_config));
  if (!config.ok()) {
    std::fprintf(stderr, "spgate-sim: %s\n", config.status().ToString().c_str());
    return 2;
  }
  if (o.pipelined()) return ReplayPipeline(o, *config, started);
  absl::StatusOr<spgate::sim::Summary> s = spgate::sim::Replay(o, *config);
  if (!s.ok()) {
    std::fprintf(stderr, "spgate-sim: %s\n", s.status().ToString().c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_sweep)) {
    auto cv = spgate::sim::ParseSweepAxis("sweep_max_length_cv", absl::GetFlag(FLAGS_sweep_max_length_cv));
    auto rs = spgate::sim::ParseSweepAxis("sweep_max_rs_wait_share",
                                          absl::GetFlag(FLAGS_sweep_max_rs_wait_share));
    if (!cv.ok() || !rs.ok()) {
      std::fprintf(stderr, "spgate-sim: %s\n", (!cv.ok() ? cv.status() : rs.status()).ToString().c_str());
      return 2;
    }
    absl::StatusOr<std::vector<spgate::sim::SweepPoint>> points =
        spgate::sim::Sweep(o, *config, *cv, *rs);
    if (!points.ok()) {
      std::fprintf(stderr, "spgate-sim: %s\n", points.status().ToString().c_str());
      return 2;
    }
    std::fprintf(stderr, "\n%s\n", spgate::sim::SweepTable(*points, o.groups).c_str());
    s->extra_json["sweep"] = spgate::sim::SweepJson(*points, o.groups);
  }
  if (absl::GetFlag(FLAGS_compare)) {
    absl::StatusOr<spgate::sim::CompareResult> r = RunCompare(o, *config);
    if (!r.ok()) {
      std::fprintf(stderr, "spgate-sim: %s\n", r.status().ToString().c_str());
      return 2;
    }
    std::fprintf(stderr, "\n%s\n", spgate::sim::CompareTable(*r).c_str());
    if (int rc = CompareOutputs(*r, *s); rc != 0) return rc;
  }
  return Emit(*s, started);
}
