// token_logprobs.cuh: the per-token log-probability kernel's source, shared
// by nvcc (token_logprobs.cu) and tests/emu/test_token_logprobs_emu.cpp,
// which runs it on the CPU under tests/emu/cuda_emu.h against float64.
//
// The CUDA twin of src/ops/token_logprobs.c. One block per row, as the
// fused cross-entropy (cross_entropy.cuh): one read of the row for its max
// m, s = sum_j e^(x_j - m) and u = sum_j e^(x_j - m) (x_j - m) together
// (online: each thread keeps its own (m, s, u), merged across the block),
// then, where dlogits is asked for, a second read that writes the gradient
// over the logits (in place, or into a buffer of their dtype). 16-byte loads
// (8 bf16 or 4 fp32) between a scalar head and tail; fp32 arithmetic. The
// sums leave the target out (r, u over j != t; every thread's max starts at
// x_t), which is added once at the end: s = r + e^(x_t - m). Then
//   logp    = (x_t - m) - log s                 (= x_t - lse, lse = m + log s)
//   entropy = log s - u / s                     (= lse - sum_j p_j x_j)
//   dlogits = -coef p_j (j != t),  coef r / s (j == t),  p_j = e^(x_j - m) / s
// Every term of logp and entropy has one sign (x - m <= 0), so neither
// loses digits to a cancellation however large the logits. Near p_t = 1
// the target's gradient coef (1 - p_t) = coef r / s keeps r's relative
// precision: with the target's e^0 = 1 inside the running sums, each small
// term added to it rounded at 2^-24 and 1 - p_t kept those errors (3 times
// the tolerance at vocab 32003 in tests/emu).
//
// Targets: a row whose target is ignore_index, or outside [0, vocab), gets
// 0 in logp, entropy and dlogits. The CPU op refuses an out-of-range target;
// here the caller checks the targets on the host (fsdp.engine, llama's
// count_targets) before the device copy, and a kernel cannot report one.
//
// The includer provides ld(p, i) / st(p, i, v) for float and
// __nv_bfloat16, f32_of_bits(unsigned), bits_of_f32(float),
// bf16_bits(float) (round to nearest even), FSDP_TL_SHARED(name) (the
// block's dynamic shared memory, 96 floats), FSDP_VEC_ALIGNED(p) (vec16.cuh),
// __expf, logf, __shfl_xor_sync and __syncthreads. blockDim.x: a multiple
// of 32, at most 1024.
#ifndef FSDP_KERNELS_TOKEN_LOGPROBS_CUH
#define FSDP_KERNELS_TOKEN_LOGPROBS_CUH

#include "vec16.cuh"

namespace fsdp_tl {

/* running max m, s = sum e^(x - m), u = sum e^(x - m) (x - m) */
struct Online {
  float m, s, u;
};

/* a's sums moved to the larger max M: e^(a.m - M) (u + (a.m - M) s) */
__device__ __forceinline__ void rebase(const Online &a, float M, float &s, float &u) {
  if (a.m == -INFINITY) { /* empty, or all -inf: nothing (and no 0 x -inf) */
    s = 0.0f, u = 0.0f;
    return;
  }
  float d = a.m - M, e = __expf(d);
  s = a.s * e, u = (a.u + d * a.s) * e;
}

__device__ __forceinline__ Online merge(Online a, Online b) {
  float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return a; /* both empty (or all -inf) */
  float sa, ua, sb, ub;
  rebase(a, m, sa, ua);
  rebase(b, m, sb, ub);
  return Online{m, sa + sb, ua + ub};
}

/* one element as an Online of its own */
__device__ __forceinline__ Online one(float x) { return Online{x, 1.0f, 0.0f}; }

using fsdp_vec::Vec;
using fsdp_vec::split;


/* the block's merge of every thread's o; every thread gets the result */
__device__ __forceinline__ Online block_merge(Online o) {
  for (int k = 16; k > 0; k >>= 1)
    o = merge(o, Online{__shfl_xor_sync(0xffffffffu, o.m, k), __shfl_xor_sync(0xffffffffu, o.s, k),
                        __shfl_xor_sync(0xffffffffu, o.u, k)});
  FSDP_TL_SHARED(smem);
  float *part = (float *)smem;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  if (lane == 0) part[warp] = o.m, part[32 + warp] = o.s, part[64 + warp] = o.u;
  __syncthreads();
  o = lane < nw ? Online{part[lane], part[32 + lane], part[64 + lane]} : Online{-INFINITY, 0.0f, 0.0f};
  for (int k = 16; k > 0; k >>= 1)
    o = merge(o, Online{__shfl_xor_sync(0xffffffffu, o.m, k), __shfl_xor_sync(0xffffffffu, o.s, k),
                        __shfl_xor_sync(0xffffffffu, o.u, k)});
  return o;
}

/* grid: one block per row. logp, entropy, dlogits: each may be null;
 * coef is read only where dlogits is written (the entry point requires it) */
template <typename T>
__global__ void token_logprobs_kernel(float *logp, float *entropy, T *dlogits, const T *logits, const int32_t *targets,
                                      const float *coef, int64_t vocab, int32_t ignore_index) {
  const int n = Vec<T>::n;
  int64_t row = blockIdx.x;
  const T *x = logits + row * vocab;
  T *d = dlogits ? dlogits + row * vocab : nullptr;
  int32_t t = targets[row];
  if (t == ignore_index || t < 0 || t >= vocab) { /* out of range: as ignored (the header says why) */
    if (threadIdx.x == 0) {
      if (logp) logp[row] = 0.0f;
      if (entropy) entropy[row] = 0.0f;
    }
    for (int64_t j = threadIdx.x; d && j < vocab; j += blockDim.x) st(d, j, 0.0f);
    return;
  }
  int64_t head, tail;
  split(x, vocab, head, tail);
  const float xt = ld(x, t);
  /* pass 1: this thread's running max (from x_t) and sums over j != t */
  Online o{xt, 0.0f, 0.0f};
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x)
    if (j != t) o = merge(o, one(ld(x, j)));
  for (int64_t j = head + (int64_t)threadIdx.x * n; j < tail; j += (int64_t)blockDim.x * n) {
    float v[8];
    Vec<T>::load(x + j, v);
    for (int i = 0; i < n; i++)
      if (j + i == t) v[i] = -INFINITY;
    float m = v[0];
    for (int i = 1; i < n; i++) m = fmaxf(m, v[i]);
    if (m == -INFINITY) continue;
    float s = 0, u = 0;
    for (int i = 0; i < n; i++) {
      float y = v[i] - m, e = __expf(y);
      s += e;
      if (e > 0.0f) u += e * y; /* e^-inf = 0: no 0 x -inf */
    }
    o = merge(o, Online{m, s, u});
  }
  for (int64_t j = tail + threadIdx.x; j < vocab; j += blockDim.x)
    if (j != t) o = merge(o, one(ld(x, j)));
  o = block_merge(o);
  /* the target's own term, once: o.m >= x_t (every thread started there) */
  const float m = o.m, yt = xt - m, et = __expf(yt), r = o.s, s = r + et;
  const float log_s = logf(s);
  /* in place: every thread read its part of the row, and x[t], before
   * block_merge's barrier, so the gradient may overwrite them now */
  if (threadIdx.x == 0) {
    if (logp) logp[row] = yt - log_s;
    if (entropy) entropy[row] = log_s - (et > 0.0f ? o.u + et * yt : o.u) / s;
  }
  if (!d) return;
  /* pass 2: -coef p_j = c e^(x_j - m), c = -coef / s; at t: coef r / s
   * (in place, or elsewhere at the same alignment; else element by element) */
  const float cf = coef[row], c = -cf / s, dt = cf * (r / s);
  if (((uintptr_t)d & 15) != ((uintptr_t)x & 15)) head = tail = 0;
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) st(d, j, j == t ? dt : c * __expf(ld(x, j) - m));
  for (int64_t j = head + (int64_t)threadIdx.x * n; j < tail; j += (int64_t)blockDim.x * n) {
    float v[8];
    Vec<T>::load(x + j, v);
    for (int i = 0; i < n; i++) v[i] = j + i == t ? dt : c * __expf(v[i] - m);
    Vec<T>::store(d + j, v);
  }
  for (int64_t j = tail + threadIdx.x; j < vocab; j += blockDim.x) st(d, j, j == t ? dt : c * __expf(ld(x, j) - m));
}

}  // namespace fsdp_tl

#endif
