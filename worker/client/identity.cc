// Job identity from the launcher; see identity.h.
#include "worker/client/identity.h"

#include <cstdlib>

#include "absl/random/random.h"
#include "absl/strings/str_format.h"

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
  if (std::string v = Env("SLURM_JOB_ID"); !v.empty()) {
    const std::string restarts = Env("SLURM_RESTART_COUNT");
    return "slurm-" + v + (restarts.empty() ? "" : "." + restarts);
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

}  // namespace spgate::client
