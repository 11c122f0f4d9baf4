// Writes the seed corpora of the four harnesses (tests/fuzz/corpus/<harness>/), run once
// by hand and committed; the files are small valid (and a few deliberately invalid)
// inputs, so the fuzzers start from messages the daemon really sees.
//
// Usage: build/tests/fuzz_make_corpus tests/fuzz/corpus
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "google/protobuf/text_format.h"
#include "spgate/v1/admin.pb.h"
#include "spgate/v1/gate.pb.h"
#include "tests/fuzz/fuzz_input.h"

namespace spgate::fuzz {
namespace {

class Corpus {
 public:
  Corpus(std::filesystem::path root, std::string harness) : dir_(root / harness) {
    std::filesystem::create_directories(dir_);
  }
  void Add(const std::string& name, const std::string& bytes) {
    char prefix[8];
    std::snprintf(prefix, sizeof(prefix), "%02d-", n_++);
    std::ofstream(dir_ / (prefix + name), std::ios::binary | std::ios::trunc) << bytes;
  }

 private:
  std::filesystem::path dir_;
  int n_ = 0;
};

v1::BatchPlan Plan(int64_t step, std::vector<int64_t> lengths, int group = 0) {
  v1::BatchPlan p;
  p.set_job_id("job-a");
  p.set_group(group);
  p.set_step(step);
  for (int64_t l : lengths) p.add_lengths(l);
  return p;
}

v1::StepTelemetry Telemetry(int64_t step, int rank, double rs_wait, v1::Mode mode) {
  v1::StepTelemetry t;
  t.set_job_id("job-a");
  t.set_rank_in_group(rank);
  t.set_step(step);
  t.set_mode(mode);
  t.set_reason(v1::GATES_PASSED);
  t.set_step_time_s(1.0);
  t.set_rs_wait_s(rs_wait);
  t.set_all_gather_s(0.1);
  t.set_norm_stall_s(0.01);
  t.set_effective_tokens(8192);
  t.set_padding_tokens(512);
  t.set_peak_memory_bytes(uint64_t{20} << 30);
  return t;
}

std::string Bytes(const google::protobuf::Message& m) { return m.SerializeAsString(); }

void WorkerMessages(Corpus c) {
  const std::vector<int64_t> even(8, 1024), mixed = {128, 4096, 256, 8192, 64, 2048, 512, 16384};
  v1::WorkerMessage m;
  *m.add_plans() = Plan(0, even);
  c.Add("plan-even", Record(0, Bytes(m)));
  m.Clear();
  *m.add_plans() = Plan(0, mixed);
  c.Add("plan-mixed", Record(0, Bytes(m)));
  std::string steps;
  for (int s = 0; s < 12; ++s) {
    v1::WorkerMessage w;
    *w.add_plans() = Plan(s, s % 3 == 0 ? mixed : even);
    *w.add_telemetry() = Telemetry(s, 0, s < 6 ? 0.05 : 0.4, v1::SEQUENCE_PARALLEL);
    steps += Record(0, Bytes(w));
    v1::WorkerMessage r;
    *r.add_telemetry() = Telemetry(s, 1, s < 6 ? 0.05 : 0.4, v1::SEQUENCE_PARALLEL);
    steps += Record(1, Bytes(r));
  }
  c.Add("twelve-steps-two-ranks", steps);
  m.Clear();
  *m.add_plans() = Plan(5, even);
  *m.add_plans() = Plan(5, even);   // a retry: the cached decision
  *m.add_plans() = Plan(4, even);   // behind
  *m.add_plans() = Plan(100000, even);  // far ahead: refused
  c.Add("plans-retry-behind-ahead", Record(0, Bytes(m)));
  m.Clear();
  *m.add_plans() = Plan(0, {});
  *m.add_plans() = Plan(1, {0, -5, 1});
  *m.add_plans() = Plan(2, even, /*group=*/7);
  auto bad_job = Plan(3, even);
  bad_job.set_job_id("other");
  *m.add_plans() = bad_job;
  c.Add("plans-invalid", Record(0, Bytes(m)));
  m.Clear();
  *m.add_plans() = Plan(0, even);
  c.Add("plan-from-follower", Record(1, Bytes(m)));
  m.Clear();
  auto mem = Plan(0, even);
  mem.set_predicted_peak_bytes_sp(uint64_t{90} << 30);
  mem.set_predicted_peak_bytes_tp(uint64_t{60} << 30);
  mem.set_memory_budget_bytes(uint64_t{80} << 30);
  *m.add_plans() = mem;
  c.Add("plan-memory-gate", Record(0, Bytes(m)));
  m.Clear();
  auto* hb = m.mutable_heartbeat();
  auto* ld = hb->add_local_decisions();
  ld->set_reason(v1::LENGTH_CV);
  ld->set_count(3);
  ld = hb->add_local_decisions();
  ld->set_reason(v1::GATES_PASSED);
  ld->set_count(10);
  hb->set_telemetry_sent(4);
  c.Add("heartbeat", Record(0, Bytes(m)) + Record(1, Bytes(m)));
  ld->set_count(-1);
  ld->set_reason(static_cast<v1::Reason>(99));
  c.Add("heartbeat-odd-reason", Record(0, Bytes(m)));
  m.Clear();
  auto t = Telemetry(0, 0, 2.0, v1::TENSOR_PARALLEL_ONLY);
  t.set_step_time_s(-1);
  *m.add_telemetry() = t;
  t = Telemetry(1, 5, 0.1, static_cast<v1::Mode>(7));
  *m.add_telemetry() = t;
  c.Add("telemetry-invalid", Record(0, Bytes(m)));
  m.Clear();
  m.set_session_id("not-a-session");
  *m.add_plans() = Plan(0, even);
  c.Add("unknown-session", Record(0, Bytes(m)));
  v1::DecideRequest d;
  *d.mutable_plan() = Plan(0, mixed);
  c.Add("decide-leader", Record(2, Bytes(d)));
  d.set_session_id("bogus");
  c.Add("decide-unknown-session", Record(2, Bytes(d)));
  v1::RegisterRequest r;
  r.set_job_id("job-a");
  r.set_group(1);
  r.set_group_size(2);
  r.set_incarnation("launch-1");
  r.set_launch_credential("test-launch-credential-0001");
  c.Add("register-group-1", Record(3, Bytes(r)));
  r.set_group(0);
  r.set_incarnation("launch-2");
  r.set_launch_credential("test-launch-credential-0001");
  c.Add("register-relaunch", Record(3, Bytes(r)) + Record(0, [&] {
    v1::WorkerMessage w;
    *w.add_plans() = Plan(0, even);
    return Bytes(w);
  }()));
  r.set_group_size(100000);
  r.set_rank_in_group(-1);
  r.set_job_id("bad job/id");
  c.Add("register-invalid", Record(3, Bytes(r)));
  c.Add("clock-sweep", Record(0, [&] {
    v1::WorkerMessage w;
    *w.add_plans() = Plan(0, even);
    return Bytes(w);
  }()) + Record(4, std::string("\xff\x03", 2)) + Record(4, std::string("\xff\xff", 2)));
  c.Add("empty", "");
}

void AdminRequests(Corpus c) {
  v1::UpdateGateConfigRequest u;
  u.mutable_config()->set_max_length_cv(0.3);
  c.Add("update-global", Record(0, Bytes(u)));
  u.set_job_id("job-a");
  u.mutable_config()->set_max_rs_wait_share(0.5);
  u.mutable_config()->set_rs_wait_reenable_margin(0.1);
  c.Add("update-job", Record(0, Bytes(u)));
  u.mutable_update_mask()->add_paths("max_length_cv");
  u.mutable_update_mask()->add_paths("window_steps");
  c.Add("update-job-mask-remove", Record(0, Bytes(u)));
  u.Clear();
  u.mutable_config()->set_rs_wait_reenable_margin(0.5);
  c.Add("update-global-margin-too-big", Record(0, Bytes(u)));
  u.Clear();
  u.set_job_id("job-a");
  u.mutable_config()->set_max_rs_wait_share(0.05);
  v1::UpdateGateConfigRequest g;
  g.mutable_config()->set_rs_wait_reenable_margin(0.04);
  c.Add("job-then-global-conflict", Record(0, Bytes(u)) + Record(0, Bytes(g)));
  u.Clear();
  u.mutable_config()->set_window_steps(0);
  u.mutable_config()->set_memory_headroom(1.5);
  u.mutable_update_mask()->add_paths("no_such_field");
  c.Add("update-invalid", Record(0, Bytes(u)));
  u.Clear();
  u.set_expected_version(7);
  u.mutable_config()->set_min_dwell_steps(5);
  c.Add("update-stale-version", Record(0, Bytes(u)));
  v1::PinModeRequest p;
  p.set_job_id("job-a");
  p.set_mode(v1::TENSOR_PARALLEL_ONLY);
  p.mutable_duration()->set_seconds(600);
  c.Add("pin-job", Record(1, Bytes(p)) + Record(4, "abcd"));
  p.set_group(1);
  p.set_force(true);
  c.Add("pin-group-forced", Record(1, Bytes(p)) + Record(4, "abcd"));
  p.mutable_duration()->set_seconds(-5);
  p.set_mode(static_cast<v1::Mode>(9));
  c.Add("pin-invalid", Record(1, Bytes(p)));
  p.Clear();
  p.set_job_id("job-a");
  p.set_mode(v1::SEQUENCE_PARALLEL);
  p.mutable_duration()->set_seconds(10);
  c.Add("pin-expires", Record(1, Bytes(p)) + Record(5, std::string("\x20\x00", 2)) + Record(4, "xyz"));
  v1::UnpinRequest un;
  un.set_job_id("job-a");
  c.Add("pin-unpin", Record(1, Bytes(p)) + Record(2, Bytes(un)));
  un.set_group(3);
  c.Add("unpin-unknown-group", Record(2, Bytes(un)));
  v1::EvaluateGatesRequest e;
  for (int64_t l : {128, 4096, 256, 8192}) e.add_lengths(l);
  c.Add("evaluate-global", Record(3, Bytes(e)));
  e.set_job_id("job-a");
  e.set_group(0);
  e.set_rs_wait_share(0.3);
  e.set_predicted_peak_bytes_sp(uint64_t{90} << 30);
  e.set_predicted_peak_bytes_tp(uint64_t{60} << 30);
  e.set_memory_budget_bytes(uint64_t{80} << 30);
  e.mutable_config()->set_max_length_cv(1.0);
  c.Add("evaluate-job-group", Record(3, Bytes(e)));
  e.mutable_config()->set_max_length_cv(-1.0);
  e.add_lengths(0);
  c.Add("evaluate-invalid", Record(3, Bytes(e)));
  c.Add("decide-then-update", Record(4, "aaaaaaaa") + Record(4, "a\xf0z") + [&] {
    v1::UpdateGateConfigRequest r;
    r.set_job_id("job-a");
    r.mutable_config()->set_max_length_cv(5);
    return Record(0, Bytes(r));
  }());
  c.Add("empty", "");
}

void ConfigTexts(Corpus c) {
  v1::GateConfig full;
  full.set_max_length_cv(0.18);
  full.set_max_rs_wait_share(0.22);
  full.set_bucket_target_cv(0.15);
  full.set_rs_wait_reenable_margin(0.03);
  full.set_probe_interval_steps(200);
  full.set_min_dwell_steps(20);
  full.set_window_steps(50);
  full.set_memory_headroom(0.9);
  std::string text;
  google::protobuf::TextFormat::PrintToString(full, &text);
  c.Add("defaults.textproto", text);
  c.Add("one-field.textproto", "max_length_cv: 0.25\n");
  c.Add("comments.textproto", "# the gates\nmax_rs_wait_share: 0.3  # rolling\nwindow_steps: 100\n");
  c.Add("exponent.textproto", "max_length_cv: 1e-1\nmemory_headroom: 9.5E-1\n");
  c.Add("margin-too-big.textproto", "max_rs_wait_share: 0.1\nrs_wait_reenable_margin: 0.2\n");
  c.Add("out-of-range.textproto", "window_steps: 0\nmemory_headroom: 1.01\n");
  c.Add("nan-inf.textproto", "max_length_cv: nan\nbucket_target_cv: inf\n");
  c.Add("unknown-field.textproto", "max_length: 0.2\n");
  c.Add("wrong-type.textproto", "window_steps: 1.5\n");
  c.Add("duplicate.textproto", "max_length_cv: 0.2\nmax_length_cv: 0.3\n");
  c.Add("huge-count.textproto", "probe_interval_steps: 9223372036854775807\n");
  c.Add("braces.textproto", "{ max_length_cv: 0.2 }\n");
  c.Add("empty.textproto", "");
}

void StateFiles(Corpus c) {
  v1::PersistedState s;
  s.set_version_counter(3);
  s.mutable_global_overrides()->set_max_length_cv(0.3);
  s.set_global_version(1);
  s.mutable_global_update_time()->set_seconds(1'699'999'000);
  auto* j = s.add_jobs();
  j->set_job_id("job-a");
  j->mutable_overrides()->set_max_rs_wait_share(0.4);
  j->set_version(2);
  j->mutable_update_time()->set_seconds(1'699'999'500);
  auto* pin = s.add_pins();
  pin->set_job_id("job-a");
  pin->set_mode(v1::TENSOR_PARALLEL_ONLY);
  pin->mutable_expire_time()->set_seconds(1'700'000'600);
  pin = s.add_pins();
  pin->set_job_id("job-a");
  pin->set_group(2);
  pin->set_mode(v1::SEQUENCE_PARALLEL);
  pin->set_force(true);
  pin->mutable_expire_time()->set_seconds(1'700'003'600);
  pin = s.add_pins();
  pin->set_job_id("job-b");
  pin->set_mode(v1::SEQUENCE_PARALLEL);
  pin->mutable_expire_time()->set_seconds(1'600'000'000);  // expired
  std::string text;
  google::protobuf::TextFormat::PrintToString(s, &text);
  c.Add("full.textproto", "# spgated operator state\n" + text);
  s.mutable_file_layer()->set_window_steps(80);
  google::protobuf::TextFormat::PrintToString(s, &text);
  c.Add("with-file-layer.textproto", text);
  c.Add("empty.textproto", "");
  c.Add("counter-only.textproto", "version_counter: 5\nglobal_version: 5\n");
  c.Add("job-no-id.textproto", "jobs { overrides { max_length_cv: 0.2 } version: 1 }\n");
  c.Add("job-bad-id.textproto", "jobs { job_id: \"a b\" version: 1 }\n");
  c.Add("job-invalid-override.textproto", "jobs { job_id: \"j\" overrides { window_steps: -1 } }\n");
  c.Add("job-margin-conflict.textproto",
        "global_overrides { rs_wait_reenable_margin: 0.2 }\n"
        "jobs { job_id: \"j\" overrides { max_rs_wait_share: 0.1 } version: 2 }\n");
  c.Add("file-layer-conflict.textproto",
        "file_layer { max_rs_wait_share: 0.5 }\nglobal_overrides { rs_wait_reenable_margin: 0.3 }\n");
  c.Add("pin-bad-mode.textproto",
        "pins { job_id: \"j\" mode: 5 expire_time { seconds: 1800000000 } }\n");
  c.Add("pin-far-future.textproto",
        "pins { job_id: \"j\" group: -3 mode: TENSOR_PARALLEL_ONLY expire_time { seconds: 253402300799 } }\n");
  c.Add("timestamps-extreme.textproto",
        "global_update_time { seconds: -62135596800 nanos: 999999999 }\n"
        "jobs { job_id: \"j\" version: 9 update_time { seconds: 9223372036854775807 } }\n");
  c.Add("counter-max.textproto",
        "version_counter: 9223372036854775807\nfile_layer { window_steps: 10 }\n");
  c.Add("negative-versions.textproto", "version_counter: -1\nglobal_version: -7\n");
  c.Add("duplicate-jobs.textproto",
        "jobs { job_id: \"j\" version: 1 }\njobs { job_id: \"j\" version: 2 overrides { max_length_cv: 0.5 } }\n");
  c.Add("not-text.textproto", std::string("\x0a\x02\x08\x01\xff", 5));
}

}  // namespace
}  // namespace spgate::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_ROOT (tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  const std::filesystem::path root = argv[1];
  using spgate::fuzz::Corpus;
  spgate::fuzz::WorkerMessages(Corpus(root, "worker_message_fuzz"));
  spgate::fuzz::AdminRequests(Corpus(root, "admin_request_fuzz"));
  spgate::fuzz::ConfigTexts(Corpus(root, "config_textproto_fuzz"));
  spgate::fuzz::StateFiles(Corpus(root, "state_file_fuzz"));
  return 0;
}
