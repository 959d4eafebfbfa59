// cast.cu: bf16/fp16 -> fp32, e.g. grads before an fp32-accumulating
// reduce-scatter. Grid-stride loop; memory bound, so one element per step
// is enough.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../src/fsdp_base.h"
#include "kernels.h"

template <typename T>
__global__ void cast_to_f32(float *dst, const T *src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = static_cast<float>(src[i]);
}

extern "C" int fsdp_kernel_cast_to_f32(float *dst, const void *src, int src_dtype, size_t n, void *stream) {
  if (n == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  unsigned threads = 256;
  size_t want = (n + threads - 1) / threads;
  unsigned blocks = want > 65535u ? 65535u : static_cast<unsigned>(want);
  if (src_dtype == FSDP_BF16)
    cast_to_f32<<<blocks, threads, 0, s>>>(dst, static_cast<const __nv_bfloat16 *>(src), n);
  else if (src_dtype == FSDP_FP16)
    cast_to_f32<<<blocks, threads, 0, s>>>(dst, static_cast<const __half *>(src), n);
  else
    return static_cast<int>(cudaErrorInvalidValue);
  return static_cast<int>(cudaGetLastError());
}
