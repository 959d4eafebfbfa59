// common.cuh: what the kernel files share: the engine's error and stream
// helpers, dtype load/store (fp32 or bf16 storage, fp32 arithmetic), launch
// sizes and block reductions.
#ifndef FSDP_KERNELS_COMMON_CUH
#define FSDP_KERNELS_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "../src/base/error.h"
#include "../src/device/cuda_impl.h"
}
#include "../src/base/bf16_split.h"
#include "../src/fsdp_kernels.h"
#include "kernels.h"

#include <initializer_list>
#include <string.h>

// The entry points' pointer check: a NULL among the pointers an op needs (a
// freed tensor, a buffer never allocated) is an error naming the argument,
// not an illegal-address fault reported later, far from its cause.
//   FSDP_NEED_PTRS("cuda add", y, a, b);
static inline int fsdp_need_ptrs(const char *what, const char *names, std::initializer_list<const void *> ptrs) {
  int i = 0;
  for (const void *p : ptrs) {
    if (!p) {
      const char *at = names;
      for (int k = 0; k < i && at; k++)
        if ((at = strchr(at, ','))) at++;
      while (at && *at == ' ') at++;
      int len = at ? (int)strcspn(at, ",") : 1;
      return fsdp_fail(FSDP_EINVAL, "%s: %.*s is NULL (a freed tensor, or a buffer never allocated)", what, len,
                       at ? at : "?");
    }
    i++;
  }
  return FSDP_OK;
}
#define FSDP_NEED_PTRS(what, ...) FSDP_CHECK(fsdp_need_ptrs(what, #__VA_ARGS__, {__VA_ARGS__}))

namespace fsdpk {

inline cudaStream_t stream_of(fsdp_stream *s) {
  return s ? static_cast<cudaStream_t>(fsdp_cuda_stream_handle(s)) : static_cast<cudaStream_t>(0);
}

// the launch's own errors (bad configuration); faults inside a kernel show
// up at the stream's next synchronize
inline int launched(const char *what) {
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? FSDP_OK : fsdp_fail(FSDP_EDEVICE, "%s: %s", what, cudaGetErrorString(e));
}

inline int check_dtype(int32_t dtype, const char *what) {
  if (dtype == FSDP_FP32 || dtype == FSDP_BF16) return FSDP_OK;
  return fsdp_fail(FSDP_EINVAL, "%s: dtype %d; the CUDA ops take fp32 or bf16", what, (int)dtype);
}

__device__ __forceinline__ float ld(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ld(const __nv_bfloat16 *p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(float *p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__nv_bfloat16 *p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }
// what the kernels' shared sources (vec16.cuh) take from their includer:
// bit casts and bf16 rounding; a misaligned 16-byte access faults here by itself
__device__ __forceinline__ float f32_of_bits(unsigned u) { return __uint_as_float(u); }
__device__ __forceinline__ unsigned bits_of_f32(float v) { return __float_as_uint(v); }
__device__ __forceinline__ unsigned bf16_bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
#define FSDP_VEC_ALIGNED(p)
// 1 when every pointer is 16-byte aligned: the kernels of the shared
// sources may then move whole 16-byte vectors
static inline int aligned16(std::initializer_list<const void *> ptrs) {
  for (const void *p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) & 15u) return 0;
  return 1;
}
// a param's compute copy: bf16 ties away from zero, as on the CPU (base/bf16_split.h says why)
__device__ __forceinline__ void st_param(float *p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st_param(__nv_bfloat16 *p, int64_t i, float v) {
  reinterpret_cast<uint16_t *>(p)[i] = fsdp_bf16_round_away(v);
}
__device__ __forceinline__ void atomic_add(float *p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(__nv_bfloat16 *p, float v) { atomicAdd(p, __float2bfloat16_rn(v)); }

// grid-stride launches: enough blocks to fill the GPU, no more
inline unsigned blocks_for(int64_t n, unsigned threads) {
  int64_t b = (n + threads - 1) / threads;
  return b < 1 ? 1u : (b > 65535 * 8 ? 65535u * 8 : static_cast<unsigned>(b));
}

// op over a block (blockDim.x a multiple of 32, at most 1024); every
// thread gets the result
template <typename F>
__device__ float block_reduce(float v, F op) {
  const float identity = F::identity();
  __shared__ float part[32];
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = lane < nw ? part[lane] : identity;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
struct Sum {
  __device__ static float identity() { return 0.0f; }
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Max {
  __device__ static float identity() { return -INFINITY; }
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

}  // namespace fsdpk

// calls F<float> or F<__nv_bfloat16> by the runtime dtype
#define FSDP_DISPATCH(dtype, T, ...)          \
  do {                                        \
    if ((dtype) == FSDP_FP32) {               \
      using T = float;                        \
      __VA_ARGS__;                            \
    } else {                                  \
      using T = __nv_bfloat16;                \
      __VA_ARGS__;                            \
    }                                         \
  } while (0)

#endif
