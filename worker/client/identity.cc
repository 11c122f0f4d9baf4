// Job identity and the launch credential from the launcher; see identity.h.
#include "worker/client/identity.h"

#include <sys/utsname.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/hardware_id.h"
#include "common/secure_random.h"

namespace spgate::client {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

}  // namespace

std::string IncarnationFromEnvironment() {
  if (std::string v = Env("SPGATE_INCARNATION"); !v.empty()) return v;
  // torchrun's --rdzv-id is "none" unless given (or --standalone made one), so "none"
  // names no run; and an elastic restart keeps the run id, so the restart count is what
  // makes the relaunch new.
  if (std::string v = Env("TORCHELASTIC_RUN_ID"); !v.empty() && v != "none") {
    const std::string restarts = Env("TORCHELASTIC_RESTART_COUNT");
    return "torchelastic-" + v + "-" + (restarts.empty() ? "0" : restarts);
  }
  // Every srun of one allocation shares the job id: its step id is what makes each a
  // launch of its own (each makes its own credential, and a launch name is used once).
  if (std::string v = Env("SLURM_JOB_ID"); !v.empty()) {
    const std::string step = Env("SLURM_STEP_ID");
    const std::string restarts = Env("SLURM_RESTART_COUNT");
    return "slurm-" + v + (step.empty() ? "" : "-step" + step) +
           (restarts.empty() ? "" : "." + restarts);
  }
  if (std::string v = Env("PMIX_NAMESPACE"); !v.empty()) return "pmix-" + v;
  if (std::string v = Env("OMPI_MCA_orte_ess_jobid"); !v.empty()) return "ompi-" + v;
  return "";
}

std::string NewIncarnation() {
  absl::BitGen gen;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen), absl::Uniform<uint64_t>(gen));
}

std::string JobIdFromEnvironment() {
  if (std::string v = Env("SPGATE_JOB_ID"); !v.empty()) return v;
  return Env("SLURM_JOB_NAME");
}

std::string LaunchCredentialFromEnvironment() { return Env("SPGATE_LAUNCH_CREDENTIAL"); }

absl::StatusOr<std::string> NewLaunchCredential() {
  return RandomHex128("launch_credential");  // the launch's only secret: the kernel's CSPRNG
}

std::string HardwareIdFromEnvironment() { return Env("SPGATE_HARDWARE_ID"); }

std::string GpuHardwareId(std::string_view name, int major, int minor, uint64_t total_bytes) {
  const double gib = static_cast<double>(total_bytes) / static_cast<double>(uint64_t{1} << 30);
  return SanitizeHardwareId(
      absl::StrFormat("%s sm_%d%d %.0fGiB", name, major, minor, std::round(gib)));
}

std::string CpuHardwareId(std::string_view cpuinfo) {
  // The value of the first line "<key><blanks>: <value>" with a non-empty value.
  auto value_of = [cpuinfo](std::string_view key) {
    for (size_t at = 0; at < cpuinfo.size();) {
      size_t end = cpuinfo.find('\n', at);
      if (end == std::string_view::npos) end = cpuinfo.size();
      const std::string_view line = cpuinfo.substr(at, end - at);
      at = end + 1;
      const size_t colon = line.find(':');
      if (colon == std::string_view::npos || !line.starts_with(key)) continue;
      if (line.substr(key.size(), colon - key.size()).find_first_not_of(" \t") !=
          std::string_view::npos) {
        continue;  // another key that starts with this one
      }
      if (std::string v = SanitizeHardwareId(line.substr(colon + 1)); !v.empty()) return v;
    }
    return std::string();
  };
  std::string model;
  for (const char* key : {"model name", "Processor", "cpu model", "Hardware"}) {
    model = value_of(key);
    if (!model.empty()) break;
  }
  if (model.empty()) {
    utsname u{};
    model = ::uname(&u) == 0 ? SanitizeHardwareId(u.machine) : std::string();
    if (model.empty()) model = "unknown";
  }
  return SanitizeHardwareId(absl::StrCat("cpu:", model));
}

std::string DefaultHardwareId(std::string_view detected) {
  if (std::string v = HardwareIdFromEnvironment(); !v.empty()) return v;
  if (std::string d = SanitizeHardwareId(detected); !d.empty()) return d;
  static const std::string* const host = [] {
    std::ifstream in("/proc/cpuinfo");
    std::ostringstream text;
    text << in.rdbuf();
    return new std::string(CpuHardwareId(text.str()));
  }();
  return *host;
}

}  // namespace spgate::client
