// rmsnorm.cuh: RMSNorm's row kernels, y and dx, one block per row, the
// source nvcc (rmsnorm.cu) and tests/emu/test_rmsnorm_emu.cpp share.
//
// Each thread reads 16 bytes per load (8 bf16 or 4 fp32, vec16.cuh) where
// the caller found the rows 16-byte aligned (vec = 1: the buffers aligned
// and dim a multiple of the vector), else one element at a time; the sums
// are fp32 in each thread, then across the block. The H200 run of
// 2026-11-27 measured the one-element, 1024-thread version at 20% (y) and
// 14% (dx with dw) of the memory floor at the 1B shape (dim 2048).
//
// The includer provides ld(p, i) / st(p, i, v) for float and
// __nv_bfloat16, rsqrtf, __shfl_xor_sync, __syncthreads,
// FSDP_RMS_SHARED(name) (the block's dynamic shared memory, 32 floats), and
// what vec16.cuh needs.
#ifndef FSDP_KERNELS_RMSNORM_CUH
#define FSDP_KERNELS_RMSNORM_CUH

#include "vec16.cuh"

namespace fsdp_rms {

using fsdp_vec::Vec;

/* the block's sum of v, in every thread (blockDim.x a multiple of 32) */
__device__ __forceinline__ float block_sum(float v, float *part) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = lane < nw ? part[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// y = w (x r), r = 1 / sqrt(mean(x^2) + eps), saved per row
template <typename T>
__global__ void rmsnorm_fwd_kernel(T *y, float *rstd, const T *x, const T *w, int64_t dim, float eps, int vec) {
  FSDP_RMS_SHARED(smem);
  const int V = Vec<T>::n;
  const int64_t row = blockIdx.x, nv = vec ? dim / V : 0;
  const T *xr = x + row * dim;
  T *yr = y + row * dim;
  float ss = 0;
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    float v[Vec<T>::n];
    Vec<T>::load(xr + i * V, v);
    for (int k = 0; k < V; k++) ss += v[k] * v[k];
  }
  for (int64_t j = nv * V + threadIdx.x; j < dim; j += blockDim.x) {
    const float v = ld(xr, j);
    ss += v * v;
  }
  ss = block_sum(ss, (float *)smem);
  const float r = rsqrtf(ss / (float)dim + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    float v[Vec<T>::n], g[Vec<T>::n];
    Vec<T>::load(xr + i * V, v);
    Vec<T>::load(w + i * V, g);
    for (int k = 0; k < V; k++) v[k] = g[k] * (v[k] * r);
    Vec<T>::store(yr + i * V, v);
  }
  for (int64_t j = nv * V + threadIdx.x; j < dim; j += blockDim.x) st(yr, j, ld(w, j) * (ld(xr, j) * r));
}

// dx = r (w dy) - r^3 x mean(w dy x)
template <typename T>
__global__ void rmsnorm_bwd_dx_kernel(T *dx, const T *dy, const T *x, const T *w, const float *rstd, int64_t dim,
                                      int vec) {
  FSDP_RMS_SHARED(smem);
  const int V = Vec<T>::n;
  const int64_t row = blockIdx.x, nv = vec ? dim / V : 0;
  const T *xr = x + row * dim, *dyr = dy + row * dim;
  T *dxr = dx + row * dim;
  const float r = rstd[row];
  float dot = 0;
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    float a[Vec<T>::n], d[Vec<T>::n], g[Vec<T>::n];
    Vec<T>::load(xr + i * V, a);
    Vec<T>::load(dyr + i * V, d);
    Vec<T>::load(w + i * V, g);
    for (int k = 0; k < V; k++) dot += g[k] * d[k] * a[k];
  }
  for (int64_t j = nv * V + threadIdx.x; j < dim; j += blockDim.x) dot += ld(w, j) * ld(dyr, j) * ld(xr, j);
  dot = block_sum(dot, (float *)smem) / (float)dim;
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    float a[Vec<T>::n], d[Vec<T>::n], g[Vec<T>::n];
    Vec<T>::load(xr + i * V, a);
    Vec<T>::load(dyr + i * V, d);
    Vec<T>::load(w + i * V, g);
    for (int k = 0; k < V; k++) a[k] = r * g[k] * d[k] - r * r * r * a[k] * dot;
    Vec<T>::store(dxr + i * V, a);
  }
  for (int64_t j = nv * V + threadIdx.x; j < dim; j += blockDim.x)
    st(dxr, j, r * ld(w, j) * ld(dyr, j) - r * r * r * ld(xr, j) * dot);
}

/* threads per row: one vector (or element) each, whole warps, at most 1024 */
inline unsigned row_threads(int64_t dim, int vec, int V) {
  const int64_t work = vec ? dim / V : dim;
  const int64_t t = (work + 31) / 32 * 32;
  return t > 1024 ? 1024u : t < 32 ? 32u : (unsigned)t;
}

}  // namespace fsdp_rms

#endif
