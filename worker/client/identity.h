// A job's identity as the daemon keys it (docs/design.md §10): (job_id, incarnation).
// The job id names the job; the incarnation names one launch of it and must be the same
// on every rank and new on every relaunch, so that a relaunched job never receives the
// previous launch's cached decisions. Launchers already have such a value; these helpers
// read it, and make one where there is none (world rank 0 then broadcasts it).
//
// Usage:
//   std::string inc = spgate::client::IncarnationFromEnvironment();  // "" if none
//   if (inc.empty() && world_rank == 0) inc = spgate::client::NewIncarnation();
//   ... broadcast inc from world rank 0 ...
#ifndef SPGATE_WORKER_CLIENT_IDENTITY_H_
#define SPGATE_WORKER_CLIENT_IDENTITY_H_

#include <string>

namespace spgate::client {

// The launcher's run identity, first found of:
//   SPGATE_INCARNATION                        set by hand or by a wrapper
//   TORCHELASTIC_RUN_ID + "-" TORCHELASTIC_RESTART_COUNT
//                                             torchrun / TorchElastic; a restart keeps the
//                                             run id, and "none" (torchrun's default
//                                             --rdzv-id) counts as unset
//   SLURM_JOB_ID [+ "." SLURM_RESTART_COUNT]  Slurm (a requeued job keeps its id)
//   PMIX_NAMESPACE, OMPI_MCA_orte_ess_jobid   the MPI job (Open MPI / PMIx launchers)
// Empty when none is set.
std::string IncarnationFromEnvironment();

// 128 random bits as 32 hex digits.
std::string NewIncarnation();

// The job id from the environment: SPGATE_JOB_ID, else SLURM_JOB_NAME; empty if neither.
std::string JobIdFromEnvironment();

}  // namespace spgate::client

#endif  // SPGATE_WORKER_CLIENT_IDENTITY_H_
