// cross_entropy.cuh: the fused cross-entropy kernel's source, shared by
// nvcc (cross_entropy.cu) and tests/emu/test_cross_entropy_emu.cpp, which
// runs it on the CPU under tests/emu/cuda_emu.h against float64.
//
// One block per row, two passes over the row instead of three: the max and
// the sum of exponentials together (an online softmax: each thread keeps
// its running max m and sum s of exp(x - m), merged across the block), then
// the gradient written over the logits in the same storage. Both passes
// read 16 bytes per load (8 bf16 or 4 fp32) between a scalar head and tail,
// so rows at any alignment work. The H100 run of 2026-11-24 measured the
// three-pass, 2-byte-load version at 21% of its memory floor.
//
// The includer provides ld(p, i) / st(p, i, v) for float and
// __nv_bfloat16, f32_of_bits(unsigned), bits_of_f32(float),
// bf16_bits(float) (round to nearest even), FSDP_CE_SHARED(name) (the
// block's dynamic shared memory, 64 floats), FSDP_VEC_ALIGNED(p) (vec16.cuh),
// __expf, __shfl_xor_sync, __syncthreads, and atomicAdd for double and
// unsigned long long.
#ifndef FSDP_KERNELS_CROSS_ENTROPY_CUH
#define FSDP_KERNELS_CROSS_ENTROPY_CUH

#include "vec16.cuh"

namespace fsdp_ce {

struct Online {
  float m, s; /* running max, sum of exp(x - m) */
};

__device__ __forceinline__ Online merge(Online a, Online b) {
  float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return a; /* both empty (or all -inf) */
  return Online{m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}

using fsdp_vec::Vec;
using fsdp_vec::split;


template <typename T>
__global__ void cross_entropy_kernel(double *loss_sum, unsigned long long *count, T *dlogits, const T *logits,
                                     const int32_t *targets, int64_t vocab, int32_t ignore_index, float grad_scale) {
  const int n = Vec<T>::n;
  int64_t row = blockIdx.x;
  const T *x = logits + row * vocab;
  T *d = dlogits ? dlogits + row * vocab : nullptr;
  int32_t t = targets[row];
  if (t == ignore_index || t < 0 || t >= vocab) { /* bad targets are refused on the host */
    for (int64_t j = threadIdx.x; d && j < vocab; j += blockDim.x) st(d, j, 0.0f);
    return;
  }
  int64_t head, tail;
  split(x, vocab, head, tail);
  /* pass 1: this thread's running max and sum */
  Online o{-INFINITY, 0.0f};
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) o = merge(o, Online{ld(x, j), 1.0f});
  for (int64_t j = head + (int64_t)threadIdx.x * n; j < tail; j += (int64_t)blockDim.x * n) {
    float v[8];
    Vec<T>::load(x + j, v);
    float m = v[0];
    for (int i = 1; i < n; i++) m = fmaxf(m, v[i]);
    if (m == -INFINITY) continue;
    float s = 0;
    for (int i = 0; i < n; i++) s += __expf(v[i] - m);
    o = merge(o, Online{m, s});
  }
  for (int64_t j = tail + threadIdx.x; j < vocab; j += blockDim.x) o = merge(o, Online{ld(x, j), 1.0f});
  /* merged over the warp, then over the block's warps */
  for (int k = 16; k > 0; k >>= 1) o = merge(o, Online{__shfl_xor_sync(0xffffffffu, o.m, k), __shfl_xor_sync(0xffffffffu, o.s, k)});
  FSDP_CE_SHARED(smem);
  float *part = (float *)smem;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  if (lane == 0) part[warp] = o.m, part[32 + warp] = o.s;
  __syncthreads();
  o = lane < nw ? Online{part[lane], part[32 + lane]} : Online{-INFINITY, 0.0f};
  for (int k = 16; k > 0; k >>= 1) o = merge(o, Online{__shfl_xor_sync(0xffffffffu, o.m, k), __shfl_xor_sync(0xffffffffu, o.s, k)});
  float lse = o.m + logf(o.s);
  float xt = ld(x, t);
  __syncthreads(); /* every thread has read x[t] before the gradient overwrites it (in place) */
  if (threadIdx.x == 0) {
    atomicAdd(loss_sum, (double)(lse - xt));
    atomicAdd(count, 1ull);
  }
  if (!d) return;
  /* pass 2: the gradient, scale x (softmax - one-hot), over the logits (in
   * place, or elsewhere at the same alignment; else element by element) */
  if (((uintptr_t)d & 15) != ((uintptr_t)x & 15)) head = tail = 0;
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) st(d, j, grad_scale * (__expf(ld(x, j) - lse) - (j == t ? 1.0f : 0.0f)));
  for (int64_t j = head + (int64_t)threadIdx.x * n; j < tail; j += (int64_t)blockDim.x * n) {
    float v[8];
    Vec<T>::load(x + j, v);
    for (int i = 0; i < n; i++) v[i] = grad_scale * (__expf(v[i] - lse) - (j + i == t ? 1.0f : 0.0f));
    Vec<T>::store(d + j, v);
  }
  for (int64_t j = tail + threadIdx.x; j < vocab; j += blockDim.x)
    st(d, j, grad_scale * (__expf(ld(x, j) - lse) - (j == t ? 1.0f : 0.0f)));
}

}  // namespace fsdp_ce

#endif
