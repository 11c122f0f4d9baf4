// libFuzzer harness: the --state_dir loader over arbitrary file contents. Each input is
// written as the state file of one scratch directory (made once per process), loaded
// with LoadPersistedState and, when that succeeds, restored by OperatorStore::Create as
// the daemon does at start (server/operator_store.h). Either step may refuse the file,
// but only with a clear error (DATA_LOSS, INVALID_ARGUMENT or FAILED_PRECONDITION and a
// message); a store that is created must serve valid configs, globally and for every
// job it restored (docs/design.md §3, §5). Anything else aborts (a finding).
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/convert.h"
#include "server/operator_store.h"
#include "server/persistence.h"
#include "tests/fuzz/fuzz_input.h"

namespace spgate::fuzz {
namespace {

// On tmpfs when there is one: rewriting a file on a disk waits for its writeback.
const std::string& ScratchDir() {
  static const std::string dir = [] {
    std::error_code ec;
    std::string tmpl = std::filesystem::is_directory("/dev/shm", ec) ? "/dev/shm" : "/tmp";
    tmpl += "/spgate-state-fuzz.XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) Finding("mkdtemp failed");
    return tmpl;
  }();
  return dir;
}

void CheckRefusal(const absl::Status& s, const char* step) {
  const auto code = s.code();
  if ((code != absl::StatusCode::kDataLoss && code != absl::StatusCode::kInvalidArgument &&
       code != absl::StatusCode::kFailedPrecondition) ||
      s.message().empty()) {
    Finding(std::string(step) + ": unclear error: " + s.ToString());
  }
}

int Run(const uint8_t* data, size_t size) {
  QuietProtobufLogs();
  const std::string& dir = ScratchDir();
  {
    std::ofstream out(server::StateFilePath(dir), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    if (!out) Finding("cannot write the scratch state file");
  }
  absl::StatusOr<std::optional<v1::PersistedState>> loaded = server::LoadPersistedState(dir);
  if (!loaded.ok()) {
    CheckRefusal(loaded.status(), "LoadPersistedState");
    return 0;
  }
  if (!loaded->has_value()) Finding("the state file exists but loaded as missing");

  server::StoreOptions options;
  options.state_dir = dir;
  options.clock = [] { return absl::FromUnixSeconds(1'700'000'000); };
  absl::StatusOr<std::unique_ptr<server::OperatorStore>> store =
      server::OperatorStore::Create(options, v1::GateConfig{});
  if (!store.ok()) {
    CheckRefusal(store.status(), "OperatorStore::Create");
    return 0;
  }
  CheckValid((*store)->GlobalEffective(), "restored global");
  for (const std::string& job : (*store)->JobsWithOperatorState()) {
    CheckValid((*store)->ViewForJob(job).effective, "restored job " + job);
  }
  for (const auto& job : (**loaded).jobs()) {
    const v1::VersionedGateConfig served = (*store)->GetGateConfig(job.job_id());
    CheckValid(LayerGateConfig(GateConfig{}, served.config()), "served job " + job.job_id());
  }
  return 0;
}

}  // namespace
}  // namespace spgate::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return spgate::fuzz::Run(data, size);
}
