// cast.cu: bf16/fp16 -> fp32, e.g. grads before an fp32-accumulating
// reduce-scatter (whole, or rows of a chunk). Grid-stride loops; memory
// bound, so one element per step is enough.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../src/fsdp_base.h"
#include "kernels.h"

// rows x cols, row r read from src + r * src_stride, written densely:
// a chunk of every rank's slice for a chunked reduce-scatter
// (src/dist/comm_cast_chunks.c). Rows on the grid's y (grid-stride).
template <typename T>
__global__ void cast_rows_to_f32(float *dst, const T *src, size_t rows, size_t cols, size_t src_stride) {
  for (size_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < cols; i += (size_t)gridDim.x * blockDim.x)
      dst[r * cols + i] = static_cast<float>(src[r * src_stride + i]);
}

extern "C" int fsdp_kernel_cast_rows_to_f32(float *dst, const void *src, int src_dtype, size_t rows, size_t cols,
                                            size_t src_stride, void *stream) {
  if (rows == 0 || cols == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  unsigned threads = 256;
  size_t want = (cols + threads - 1) / threads;
  dim3 grid(want > 4096u ? 4096u : static_cast<unsigned>(want), rows > 65535u ? 65535u : static_cast<unsigned>(rows));
  if (src_dtype == FSDP_BF16)
    cast_rows_to_f32<<<grid, threads, 0, s>>>(dst, static_cast<const __nv_bfloat16 *>(src), rows, cols, src_stride);
  else if (src_dtype == FSDP_FP16)
    cast_rows_to_f32<<<grid, threads, 0, s>>>(dst, static_cast<const __half *>(src), rows, cols, src_stride);
  else
    return static_cast<int>(cudaErrorInvalidValue);
  return static_cast<int>(cudaGetLastError());
}

// the contiguous cast: one row
extern "C" int fsdp_kernel_cast_to_f32(float *dst, const void *src, int src_dtype, size_t n, void *stream) {
  return fsdp_kernel_cast_rows_to_f32(dst, src, src_dtype, 1, n, n, stream);
}
