// Job identity and the launch credential from the launcher; see identity.h.
#include "worker/client/identity.h"

#include <cstdlib>

#include "absl/random/random.h"
#include "absl/strings/str_format.h"
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

}  // namespace spgate::client
