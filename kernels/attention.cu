// attention.cu: the CUDA twin of attention.c: causal attention with grouped
// query heads, flash-style: the T x T scores never exist in memory. Forward
// keeps one query row per thread with an online softmax and saves the
// log-sum-exp; backward recomputes the probabilities from it, one kernel for
// dq (a thread per query row) and one for dk, dv (a thread per key row,
// looping over its group's query heads), so nothing needs atomics.
// fp32 arithmetic on CUDA cores, any head_dim up to 256, fp32 or bf16: the
// fallback for what cuDNN (attention_cudnn.cpp) and our tensor-core kernels
// (attention_tc.cu) do not take; attention_choice.cu picks per call.
// Layouts: q, out, dq, dout [B, T, H, D]; k, v, dk, dv [B, T, Hkv, D]; lse [B, H, T].
#include <stdlib.h>
#include <string.h>

#include "attention_impl.h"
#include "common.cuh"

using namespace fsdpk;

enum { QROWS = 32, KTILE = 16 };

struct Shape {
  int64_t B, T, H, Hkv, D;
  float scale;
};

// rows [r0, r0 + R) of head h of one or two [B, T, heads, D] tensors into
// shared memory (row pitch `pitch`), zeros past the sequence's end; the
// block's QROWS threads share the copy
template <typename T>
__device__ void load_rows(float *d1, const T *s1, float *d2, const T *s2, int pitch, int64_t b, int64_t r0, int R,
                          int64_t heads, int64_t h, const Shape &sh) {
  const int D = (int)sh.D;
  for (int e = threadIdx.x; e < R * D; e += QROWS) {
    int r = e / D, c = e % D;
    int64_t t = r0 + r;
    size_t off = ((b * sh.T + t) * heads + h) * D + c;
    d1[r * pitch + c] = t < sh.T ? ld(s1, off) : 0.0f;
    if (d2) d2[r * pitch + c] = t < sh.T ? ld(s2, off) : 0.0f;
  }
}

template <typename T, int MAXD>
__global__ void attn_fwd(T *out, float *lse, const T *q, const T *k, const T *v, Shape sh) {
  extern __shared__ float smem[];
  const int D = (int)sh.D, P = D + 1;
  float *qs = smem;                     // [QROWS][P]
  float *ks = qs + QROWS * P;           // [KTILE][D]
  float *vs = ks + KTILE * D;           // [KTILE][D]
  int64_t b = blockIdx.z, h = blockIdx.y, i0 = (int64_t)blockIdx.x * QROWS;
  int64_t hk = h / (sh.H / sh.Hkv);
  int tid = threadIdx.x;
  int64_t i = i0 + tid;
  load_rows(qs, q, (float *)nullptr, (const T *)nullptr, P, b, i0, QROWS, sh.H, h, sh);
  float acc[MAXD];
#pragma unroll
  for (int c = 0; c < MAXD; c++) acc[c] = 0;
  float m = -INFINITY, l = 0;
  int64_t last = i0 + QROWS - 1 < sh.T - 1 ? i0 + QROWS - 1 : sh.T - 1;
  for (int64_t j0 = 0; j0 <= last; j0 += KTILE) {
    __syncthreads();
    load_rows(ks, k, vs, v, D, b, j0, KTILE, sh.Hkv, hk, sh);
    __syncthreads();
    if (i >= sh.T) continue;
    for (int r = 0; r < KTILE; r++) {
      int64_t j = j0 + r;
      if (j > i) break;
      float sdot = 0;
#pragma unroll
      for (int c = 0; c < MAXD; c++)
        if (c < D) sdot += qs[tid * P + c] * ks[r * D + c];
      sdot *= sh.scale;
      float mn = fmaxf(m, sdot), corr = __expf(m - mn), p = __expf(sdot - mn);
      l = l * corr + p;
#pragma unroll
      for (int c = 0; c < MAXD; c++)
        if (c < D) acc[c] = acc[c] * corr + p * vs[r * D + c];
      m = mn;
    }
  }
  if (i < sh.T) {
    float inv = 1.0f / l;
#pragma unroll
    for (int c = 0; c < MAXD; c++)
      if (c < D) st(out, ((b * sh.T + i) * sh.H + h) * D + c, acc[c] * inv);
    lse[(b * sh.H + h) * sh.T + i] = m + logf(l);
  }
}

// dq_i = scale sum_j p_ij (dp_ij - Di) k_j, dp_ij = dout_i . v_j, Di = dout_i . out_i
template <typename T, int MAXD>
__global__ void attn_bwd_dq(T *dq, const T *dout, const T *q, const T *k, const T *v, const T *out, const float *lse,
                            Shape sh) {
  extern __shared__ float smem[];
  const int D = (int)sh.D, P = D + 1;
  float *qs = smem, *dos = qs + QROWS * P, *ks = dos + QROWS * P, *vs = ks + KTILE * D;
  int64_t b = blockIdx.z, h = blockIdx.y, i0 = (int64_t)blockIdx.x * QROWS;
  int64_t hk = h / (sh.H / sh.Hkv);
  int tid = threadIdx.x;
  int64_t i = i0 + tid;
  load_rows(qs, q, dos, dout, P, b, i0, QROWS, sh.H, h, sh);
  __syncthreads();
  float Di = 0, L = 0;
  if (i < sh.T) {
    for (int c = 0; c < D; c++) Di += dos[tid * P + c] * ld(out, ((b * sh.T + i) * sh.H + h) * D + c);
    L = lse[(b * sh.H + h) * sh.T + i];
  }
  float acc[MAXD];
#pragma unroll
  for (int c = 0; c < MAXD; c++) acc[c] = 0;
  int64_t last = i0 + QROWS - 1 < sh.T - 1 ? i0 + QROWS - 1 : sh.T - 1;
  for (int64_t j0 = 0; j0 <= last; j0 += KTILE) {
    __syncthreads();
    load_rows(ks, k, vs, v, D, b, j0, KTILE, sh.Hkv, hk, sh);
    __syncthreads();
    if (i >= sh.T) continue;
    for (int r = 0; r < KTILE; r++) {
      int64_t j = j0 + r;
      if (j > i) break;
      float sdot = 0, dp = 0;
#pragma unroll
      for (int c = 0; c < MAXD; c++)
        if (c < D) {
          sdot += qs[tid * P + c] * ks[r * D + c];
          dp += dos[tid * P + c] * vs[r * D + c];
        }
      float p = __expf(sdot * sh.scale - L), ds = p * (dp - Di) * sh.scale;
#pragma unroll
      for (int c = 0; c < MAXD; c++)
        if (c < D) acc[c] += ds * ks[r * D + c];
    }
  }
  if (i < sh.T) {
#pragma unroll
    for (int c = 0; c < MAXD; c++)
      if (c < D) st(dq, ((b * sh.T + i) * sh.H + h) * D + c, acc[c]);
  }
}

// dv_j = sum_{h in group, i >= j} p_ij dout_i;  dk_j = scale sum p_ij (dp_ij - Di) q_i
template <typename T, int MAXD>
__global__ void attn_bwd_dkv(T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v, const T *out,
                             const float *lse, Shape sh) {
  extern __shared__ float smem[];
  const int D = (int)sh.D, P = D + 1;
  float *ks = smem, *vs = ks + QROWS * P, *dks = vs + QROWS * P;  // this block's key rows [QROWS][P]
  float *qt = dks + QROWS * P, *dot = qt + KTILE * D;             // a tile of query rows [KTILE][D]
  float *Lt = dot + KTILE * D, *Dt = Lt + KTILE;                   // their lse and Di
  int64_t b = blockIdx.z, hk = blockIdx.y, j0 = (int64_t)blockIdx.x * QROWS;
  int64_t group = sh.H / sh.Hkv;
  int tid = threadIdx.x;
  int64_t j = j0 + tid;
  load_rows(ks, k, vs, v, P, b, j0, QROWS, sh.Hkv, hk, sh);
  for (int e = tid; e < QROWS * P; e += QROWS) dks[e] = 0;
  float dvacc[MAXD];
#pragma unroll
  for (int c = 0; c < MAXD; c++) dvacc[c] = 0;
  for (int64_t g = 0; g < group; g++) {
    int64_t h = hk * group + g;
    for (int64_t i0 = j0; i0 < sh.T; i0 += KTILE) {  // causal: queries i >= j
      __syncthreads();
      load_rows(qt, q, dot, dout, D, b, i0, KTILE, sh.H, h, sh);
      if (tid < KTILE) {
        int64_t ii = i0 + tid;
        float Di = 0;
        if (ii < sh.T)
          for (int c = 0; c < D; c++) Di += ld(dout, ((b * sh.T + ii) * sh.H + h) * D + c) * ld(out, ((b * sh.T + ii) * sh.H + h) * D + c);
        Dt[tid] = Di;
        Lt[tid] = ii < sh.T ? lse[(b * sh.H + h) * sh.T + ii] : 0.0f;
      }
      __syncthreads();
      if (j >= sh.T) continue;
      for (int r = 0; r < KTILE; r++) {
        int64_t ii = i0 + r;
        if (ii >= sh.T) break;
        if (ii < j) continue;
        float sdot = 0, dp = 0;
#pragma unroll
        for (int c = 0; c < MAXD; c++)
          if (c < D) {
            sdot += qt[r * D + c] * ks[tid * P + c];
            dp += dot[r * D + c] * vs[tid * P + c];
          }
        float p = __expf(sdot * sh.scale - Lt[r]), ds = p * (dp - Dt[r]) * sh.scale;
#pragma unroll
        for (int c = 0; c < MAXD; c++)
          if (c < D) {
            dvacc[c] += p * dot[r * D + c];
            dks[tid * P + c] += ds * qt[r * D + c];
          }
      }
    }
  }
  if (j < sh.T) {
#pragma unroll
    for (int c = 0; c < MAXD; c++)
      if (c < D) {
        size_t off = ((b * sh.T + j) * sh.Hkv + hk) * D + c;
        st(dv, off, dvacc[c]);
        st(dk, off, dks[tid * P + c]);
      }
  }
}

extern "C" int fsdp_attention_check_args(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int32_t dtype,
                                         const char *what) {
  if (B < 0 || T < 0 || H < 1 || Hkv < 1 || H % Hkv || D < 1 || D > 256 || B > 65535 || H > 65535)
    return fsdp_fail(FSDP_EINVAL, "%s: batch %lld, seq %lld, heads %lld, kv heads %lld (dividing heads), head_dim %lld (1..256)",
                     what, (long long)B, (long long)T, (long long)H, (long long)Hkv, (long long)D);
  return check_dtype(dtype, what);
}

static int check_shape(Shape *sh, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int32_t dtype, const char *what) {
  FSDP_CHECK(fsdp_attention_check_args(B, T, H, Hkv, D, dtype, what));
  *sh = Shape{B, T, H, Hkv, D, 1.0f / sqrtf((float)D)};
  return FSDP_OK;
}

// launches K<T, MAXD> with the smallest MAXD >= D
#define FSDP_ATTN_LAUNCH(KERNEL, grid, smem, st_, D, ...)                                             \
  do {                                                                                                \
    auto launch = [&](auto kern) {                                                                    \
      cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(smem));           \
      kern<<<grid, QROWS, smem, st_>>>(__VA_ARGS__);                                                  \
    };                                                                                                \
    if ((D) <= 32) launch(KERNEL<T, 32>);                                                             \
    else if ((D) <= 64) launch(KERNEL<T, 64>);                                                        \
    else if ((D) <= 128) launch(KERNEL<T, 128>);                                                      \
    else launch(KERNEL<T, 256>);                                                                      \
  } while (0)

extern "C" int fsdp_attention_simple_forward(void *out, float *lse, const void *q, const void *k, const void *v,
                                             int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads, int64_t head_dim,
                                             int32_t dtype, void *stream) {
  Shape sh;
  FSDP_CHECK(check_shape(&sh, batch, seq, heads, kv_heads, head_dim, dtype, "cuda attention"));
  if (batch * seq == 0) return FSDP_OK;
  dim3 grid((unsigned)((seq + QROWS - 1) / QROWS), (unsigned)heads, (unsigned)batch);
  size_t smem = sizeof(float) * (QROWS * (head_dim + 1) + 2 * KTILE * head_dim);
  cudaStream_t st_ = static_cast<cudaStream_t>(stream);
  FSDP_DISPATCH(dtype, T, FSDP_ATTN_LAUNCH(attn_fwd, grid, smem, st_, head_dim, (T *)out, lse, (const T *)q, (const T *)k,
                                           (const T *)v, sh));
  return launched("cuda attention forward");
}

extern "C" int fsdp_attention_simple_backward(void *dq, void *dk, void *dv, const void *dout, const void *q,
                                              const void *k, const void *v, const void *out, const float *lse,
                                              int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                              int64_t head_dim, int32_t dtype, void *stream) {
  Shape sh;
  FSDP_CHECK(check_shape(&sh, batch, seq, heads, kv_heads, head_dim, dtype, "cuda attention backward"));
  if (batch * seq == 0) return FSDP_OK;
  cudaStream_t st_ = static_cast<cudaStream_t>(stream);
  dim3 gq((unsigned)((seq + QROWS - 1) / QROWS), (unsigned)heads, (unsigned)batch);
  size_t smq = sizeof(float) * (2 * QROWS * (head_dim + 1) + 2 * KTILE * head_dim);
  FSDP_DISPATCH(dtype, T, FSDP_ATTN_LAUNCH(attn_bwd_dq, gq, smq, st_, head_dim, (T *)dq, (const T *)dout, (const T *)q,
                                           (const T *)k, (const T *)v, (const T *)out, lse, sh));
  dim3 gk((unsigned)((seq + QROWS - 1) / QROWS), (unsigned)kv_heads, (unsigned)batch);
  size_t smk = sizeof(float) * (3 * QROWS * (head_dim + 1) + 2 * KTILE * head_dim + 2 * KTILE);
  FSDP_DISPATCH(dtype, T, FSDP_ATTN_LAUNCH(attn_bwd_dkv, gk, smk, st_, head_dim, (T *)dk, (T *)dv, (const T *)dout,
                                           (const T *)q, (const T *)k, (const T *)v, (const T *)out, lse, sh));
  return launched("cuda attention backward");
}
