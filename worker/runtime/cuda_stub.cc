// Built without CUDA: the CUDA device does not exist.
#include "worker/runtime/device.h"

namespace spgate::runtime {

absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int) {
  return absl::UnimplementedError("this spgate build has no CUDA (nvcc was not found)");
}
int CudaDevices() { return 0; }

}  // namespace spgate::runtime
