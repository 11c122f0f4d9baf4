// Built without NCCL: the NCCL backend does not exist.
#include "worker/runtime/mpi_communicator.h"

namespace spgate::runtime {

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(MPI_Comm, Device*) {
  return absl::UnimplementedError(
      "this spgate build has no NCCL backend (needs CUDA and nccl.h / libnccl)");
}
bool HaveNccl() { return false; }

}  // namespace spgate::runtime
