// The MPI side of the worker: the process grid (world = dp x pp x tp; TP groups are runs
// of tp consecutive ranks, so they stay inside a node under mpirun's default by-core
// mapping; a replica's pp stages are consecutive groups, world rank = (dp_index x pp +
// stage) x tp + tp_rank, so group index = world rank / tp as the daemon numbers groups
// with cp = 1; DP groups join the ranks with the same stage and TP rank) and the MPI communicator
// backend, which runs the collectives on host buffers. The invariant that matters: a
// TP group's communicator contains exactly the ranks that must agree on every batch's
// mode (docs/design.md §4), and the group leader is its rank 0.
//
// Usage:
//   MPI_Init(&argc, &argv);
//   ASSIGN_OR_RETURN(auto grid, ProcessGrid::Create(MPI_COMM_WORLD, /*tp=*/2));
//   auto tp_comm = CreateMpiCommunicator(grid->tp_comm());
//   ... grid.reset(); MPI_Finalize();     // the grid frees its communicators
#ifndef SPGATE_WORKER_RUNTIME_MPI_COMMUNICATOR_H_
#define SPGATE_WORKER_RUNTIME_MPI_COMMUNICATOR_H_

#include <mpi.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/runtime/communicator.h"

namespace spgate::runtime {

// An MPI return code as a Status naming the call and file:line.
absl::Status MpiStatus(int rc, const char* call, const char* file, int line);
#define SPGATE_MPI_RETURN_IF_ERROR(call)                                              \
  do {                                                                               \
    const int spgate_mpi_rc_ = (call);                                               \
    if (spgate_mpi_rc_ != MPI_SUCCESS)                                               \
      return ::spgate::runtime::MpiStatus(spgate_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (0)

class ProcessGrid {
 public:
  // Splits `world` (not owned; errors are switched to MPI_ERRORS_RETURN). INVALID_ARGUMENT
  // naming --tp when tp < 1 or tp does not divide the world size.
  static absl::StatusOr<std::unique_ptr<ProcessGrid>> Create(MPI_Comm world, int tp, int pp = 1);
  ~ProcessGrid();
  ProcessGrid(const ProcessGrid&) = delete;
  ProcessGrid& operator=(const ProcessGrid&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int dp() const { return world_size_ / (tp_ * pp_); }
  int tp_rank() const { return world_rank_ % tp_; }
  int stage() const { return (world_rank_ / tp_) % pp_; }
  int dp_rank() const { return world_rank_ / (tp_ * pp_); }  // the data-parallel replica
  int group() const { return world_rank_ / tp_; }  // TP group index
  // This TP rank in the previous / next stage of its replica; -1 at the ends.
  int prev_stage_rank() const { return stage() > 0 ? world_rank_ - tp_ : -1; }
  int next_stage_rank() const { return stage() + 1 < pp_ ? world_rank_ + tp_ : -1; }
  bool is_group_leader() const { return tp_rank() == 0; }
  // Rank among the ranks of this node (device selection).
  int local_rank() const { return local_rank_; }

  MPI_Comm world() const { return world_; }
  MPI_Comm tp_comm() const { return tp_comm_; }
  MPI_Comm dp_comm() const { return dp_comm_; }
  MPI_Comm replica_comm() const { return replica_comm_; }  // the replica's pp x tp ranks

 private:
  ProcessGrid() = default;
  MPI_Comm world_ = MPI_COMM_NULL;
  MPI_Comm tp_comm_ = MPI_COMM_NULL;
  MPI_Comm dp_comm_ = MPI_COMM_NULL;
  MPI_Comm replica_comm_ = MPI_COMM_NULL;
  int world_rank_ = 0, world_size_ = 1, tp_ = 1, pp_ = 1, local_rank_ = 0;
};

// Collectives over `comm` (duplicated; the duplicate is freed with the communicator) on
// host float buffers, timed with a steady clock around each blocking call.
absl::StatusOr<std::unique_ptr<Communicator>> CreateMpiCommunicator(MPI_Comm comm);

// NCCL over the ranks of `comm`: its rank 0 creates the ncclUniqueId and broadcasts it
// over `comm`; collectives take device buffers and are enqueued on `device`'s stream,
// timed with CUDA events. UNIMPLEMENTED in a build without CUDA / NCCL.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(MPI_Comm comm,
                                                                     Device* device);
// True when this build has the NCCL backend.
bool HaveNccl();

}  // namespace spgate::runtime

#endif  // SPGATE_WORKER_RUNTIME_MPI_COMMUNICATOR_H_
