// Host-side launch plans shared by the workspace-size functions (spgate::kernels_ref,
// no CUDA) and the CUDA launchers, so that the bytes the worker accounts for are
// exactly the bytes the kernels use. Column reductions (dgamma, dbeta, dbias)
// are done in two deterministic stages: fixed row chunks write fp32 partial sums,
// a second kernel adds the chunks in order. The number of chunks depends only on
// the shape, never on the device.
#ifndef SPGATE_KERNELS_INTERNAL_LAUNCH_PLAN_H_
#define SPGATE_KERNELS_INTERNAL_LAUNCH_PLAN_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace spgate::kernels::internal {

// LayerNorm backward: one block handles rows b, b + G, b + 2G, ... and keeps its
// columns' partial dgamma/dbeta in registers; G = LayerNormBwdBlocks(rows).
// 512 blocks keep an H100/H200 (132 SMs) busy at 1-4 blocks per SM.
inline constexpr int64_t kLayerNormBwdMaxBlocks = 512;
inline int64_t LayerNormBwdBlocks(int64_t rows) {
  return std::min<int64_t>(rows, kLayerNormBwdMaxBlocks);
}

// Generic column sums (GeLU dbias, Linear dbias): chunks of ColumnChunkRows
// rows (at least kColumnChunkMinRows), at most kColumnMaxChunks chunks, none
// empty.
inline constexpr int64_t kColumnChunkMinRows = 32;
inline constexpr int64_t kColumnMaxChunks = 128;
inline int64_t ColumnChunkRows(int64_t rows) {
  return std::max<int64_t>(kColumnChunkMinRows,
                           (rows + kColumnMaxChunks - 1) / kColumnMaxChunks);
}
inline int64_t ColumnReduceChunks(int64_t rows) {
  if (rows <= 0) return 0;
  const int64_t chunk_rows = ColumnChunkRows(rows);
  return (rows + chunk_rows - 1) / chunk_rows;
}
inline size_t ColumnReduceWorkspaceBytes(int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return 0;
  return static_cast<size_t>(ColumnReduceChunks(rows)) * static_cast<size_t>(cols) *
         sizeof(float);
}

}  // namespace spgate::kernels::internal

#endif  // SPGATE_KERNELS_INTERNAL_LAUNCH_PLAN_H_
