// A job's identity as the daemon keys it (docs/design.md §10): (job_id, incarnation), and
// the launch's credential. The job id names the job; the incarnation names one launch of
// it and must be the same on every rank and new on every relaunch, so that a relaunched
// job never receives the previous launch's cached decisions. Launchers already have such a
// value; these helpers read it, and make one where there is none (world rank 0 then
// broadcasts it).
//
// The launch credential is what makes a Register come from the launch rather than from
// anyone who can reach the worker port: the first Register of a launch sets it, every
// later one must present it. Launcher variables (SLURM_JOB_ID, TORCHELASTIC_RUN_ID, the
// MPI namespace) are visible to other users of the machine, so they are never the
// credential: it is SPGATE_LAUNCH_CREDENTIAL when a wrapper set one, else 128 bits from
// the kernel's random source made by world rank 0 and broadcast over the job's own
// communicator, which only the launch's processes share.
//
// Usage:
//   std::string inc = spgate::client::IncarnationFromEnvironment();  // "" if none
//   std::string cred = spgate::client::LaunchCredentialFromEnvironment();
//   if (world_rank == 0) {
//     if (inc.empty()) inc = spgate::client::NewIncarnation();
//     if (cred.empty()) ASSIGN_OR_RETURN(cred, spgate::client::NewLaunchCredential());
//   }
//   ... broadcast inc and cred from world rank 0 ...
#ifndef SPGATE_WORKER_CLIENT_IDENTITY_H_
#define SPGATE_WORKER_CLIENT_IDENTITY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/launch_credential.h"  // CheckLaunchCredential, the one format rule

namespace spgate::client {

// The launcher's run identity, first found of:
//   SPGATE_INCARNATION                        set by hand or by a wrapper
//   TORCHELASTIC_RUN_ID + "-" TORCHELASTIC_RESTART_COUNT
//                                             torchrun / TorchElastic; a restart keeps the
//                                             run id, and "none" (torchrun's default
//                                             --rdzv-id) counts as unset
//   SLURM_JOB_ID [+ "-step" SLURM_STEP_ID] [+ "." SLURM_RESTART_COUNT]
//                                             Slurm: each srun of an allocation is a
//                                             launch; a requeued job keeps its id
//   PMIX_NAMESPACE, OMPI_MCA_orte_ess_jobid   the MPI job (Open MPI / PMIx launchers)
// Empty when none is set.
std::string IncarnationFromEnvironment();

// 128 random bits as 32 hex digits.
std::string NewIncarnation();

// The job id from the environment: SPGATE_JOB_ID, else SLURM_JOB_NAME; empty if neither.
std::string JobIdFromEnvironment();

// SPGATE_LAUNCH_CREDENTIAL; empty when unset. Nothing else in the environment is a
// credential (see above).
std::string LaunchCredentialFromEnvironment();

// A new launch credential: 128 bits from the kernel's random source (getrandom), as 32
// lower-case hex digits. INTERNAL when the kernel gives no randomness (never on a working
// Linux).
absl::StatusOr<std::string> NewLaunchCredential();

// The credential's format is spgate::CheckLaunchCredential (common/launch_credential.h),
// the daemon's own rule.

// The hardware id (RegisterRequest.hardware_id, common/hardware_id.h): the kind of
// hardware a rank runs on, part of the learned tables' relaunch key only. GateClient::
// Create fills an empty GateClientOptions::hardware_id of a client with a controller with
// DefaultHardwareId(); a CUDA worker passes its device's GpuHardwareId (the client
// library does not link CUDA). Precedence: the option given > SPGATE_HARDWARE_ID > what
// is detected.
//
// SPGATE_HARDWARE_ID; empty when unset. Taken as it is (Create validates it).
std::string HardwareIdFromEnvironment();
// "<name> sm_<major><minor> <total memory in GiB, rounded>GiB", made valid
// (SanitizeHardwareId): e.g. "NVIDIA H200 sm_90 140GiB".
std::string GpuHardwareId(std::string_view name, int major, int minor, uint64_t total_bytes);
// "cpu:" and the first "model name" of `cpuinfo` (the text of /proc/cpuinfo; else its
// "Processor", "cpu model" or "Hardware" line, as other architectures name it), made
// valid and cut to 128 characters; "cpu:" and the machine (uname) when it has none.
std::string CpuHardwareId(std::string_view cpuinfo);
// SPGATE_HARDWARE_ID when set, else `detected` made valid when not empty, else the host's
// CpuHardwareId (/proc/cpuinfo, read once per process).
std::string DefaultHardwareId(std::string_view detected = {});

}  // namespace spgate::client

#endif  // SPGATE_WORKER_CLIENT_IDENTITY_H_
