// cuBLAS errors as absl::Status, for every spgate::kernels_cuda user (the kernels'
// launchers and the worker runtime's CUDA device): the one converter, so a cuBLAS failure
// reads and maps the same wherever it happens. The invariant that matters: library code
// never exits on a cuBLAS error; it returns a Status carrying file:line of the call.
//
//   SPGATE_CUBLAS_RETURN_IF_ERROR(cublasSaxpy(handle, n, &alpha, x, 1, y, 1));
//
// Like device_memory.h, this header includes a CUDA header (cublas_v2.h).
#ifndef SPGATE_KERNELS_CUBLAS_STATUS_H_
#define SPGATE_KERNELS_CUBLAS_STATUS_H_

#include <cublas_v2.h>

#include "absl/status/status.h"
#include "common/status_macros.h"

namespace spgate::kernels {

// Maps a cuBLAS status to a Status: SUCCESS -> OK, ALLOC_FAILED -> RESOURCE_EXHAUSTED,
// INVALID_VALUE -> INVALID_ARGUMENT, NOT_INITIALIZED / ARCH_MISMATCH / NOT_SUPPORTED ->
// FAILED_PRECONDITION, anything else -> INTERNAL. The message is
// "file:line: expr: CUBLAS_STATUS_X: text". Defined in kernels/internal/cuda_common.cu.
absl::Status CublasErrorToStatus(cublasStatus_t status, const char* expr, const char* file,
                                 int line);

}  // namespace spgate::kernels

// Returns from the enclosing function with the Status above when `expr` fails.
#define SPGATE_CUBLAS_RETURN_IF_ERROR(expr) \
  RETURN_IF_ERROR(::spgate::kernels::CublasErrorToStatus((expr), #expr, __FILE__, __LINE__))

#endif  // SPGATE_KERNELS_CUBLAS_STATUS_H_
