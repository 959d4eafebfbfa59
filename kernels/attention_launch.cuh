// attention_launch.cuh: the launches of attention.cuh's kernels, a
// template per direction over the rows' kind (CAUSAL, DOCS_ROWS,
// POS_DOCS_ROWS). Each kind's kernels are compiled in a file of their own
// (attention_causal.cu, attention_docs.cu, attention_pos.cu and
// attention_backward_pos.cu: explicit instances) so that nvcc builds them in
// parallel: in one file they were the build's longest step (223 s of its
// 228 on 2 cores, 2026-11-29). The callers see `extern template`
// declarations (FSDP_ATTN_INSTANCES below).
#ifndef FSDP_KERNELS_ATTENTION_LAUNCH_CUH
#define FSDP_KERNELS_ATTENTION_LAUNCH_CUH

#include "attention_impl.h"
#include "common.cuh"

using namespace fsdpk;

#define FSDP_ATTN_SHARED(name) extern __shared__ float name[]
#include "attention.cuh"

using namespace fsdp_attn;

static inline int check_shape(Shape *sh, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int32_t dtype, const char *what) {
  FSDP_CHECK(fsdp_attention_check_args(B, T, H, Hkv, D, dtype, what));
  *sh = Shape{B, T, H, Hkv, D, 1.0f / sqrtf((float)D), T};
  return FSDP_OK;
}

// launches KERNEL<T, MAXD, ROWS> with the smallest MAXD >= D
#define FSDP_ATTN_LAUNCH(KERNEL, ROWS, grid, smem, st_, D, ...)                                       \
  do {                                                                                                \
    auto launch = [&](auto kern) {                                                                    \
      cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(smem));           \
      kern<<<grid, QROWS, smem, st_>>>(__VA_ARGS__);                                                  \
    };                                                                                                \
    if ((D) <= 32) launch(KERNEL<T, 32, ROWS>);                                                       \
    else if ((D) <= 64) launch(KERNEL<T, 64, ROWS>);                                                  \
    else if ((D) <= 128) launch(KERNEL<T, 128, ROWS>);                                                \
    else launch(KERNEL<T, 256, ROWS>);                                                                \
  } while (0)

// rows: doc_start (DOCS_ROWS), q_pos (POS_DOCS_ROWS: its q_lo, or NULL, in
// sh) or NULL (CAUSAL)
template <int ROWS>
void launch_forward(void *out, float *lse, const void *q, const void *k, const void *v, const int32_t *rows,
                           const Shape &sh, int32_t dtype, cudaStream_t st_) {
  dim3 grid((unsigned)((sh.T + QROWS - 1) / QROWS), (unsigned)sh.H, (unsigned)sh.B);
  size_t smem = sizeof(float) * (QROWS * (sh.D + 1) + 2 * KTILE * sh.D);
  FSDP_DISPATCH(dtype, T, FSDP_ATTN_LAUNCH(attn_fwd, ROWS, grid, smem, st_, sh.D, (T *)out, lse, (const T *)q,
                                           (const T *)k, (const T *)v, rows, sh));
}

template <int ROWS>
void launch_backward(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k, const void *v,
                            const void *out, const float *lse, const int32_t *rows, const Shape &sh, int32_t dtype,
                            cudaStream_t st_) {
  dim3 gq((unsigned)((sh.T + QROWS - 1) / QROWS), (unsigned)sh.H, (unsigned)sh.B);
  size_t smq = sizeof(float) * (2 * QROWS * (sh.D + 1) + 2 * KTILE * sh.D);
  if (sh.T > 0) /* (POS without queries: dk, dv alone, zeros) */
    FSDP_DISPATCH(dtype, T, FSDP_ATTN_LAUNCH(attn_bwd_dq, ROWS, gq, smq, st_, sh.D, (T *)dq, (const T *)dout,
                                             (const T *)q, (const T *)k, (const T *)v, (const T *)out, lse, rows, sh));
  dim3 gk((unsigned)((sh.Tk + QROWS - 1) / QROWS), (unsigned)sh.Hkv, (unsigned)sh.B);
  size_t smk = sizeof(float) * (3 * QROWS * (sh.D + 1) + 2 * KTILE * sh.D + (ROWS != CAUSAL ? 3 : 2) * KTILE);
  if (sh.Tk > 0) /* (POS without keys, every query at -1: dq alone, zeros; an empty grid is a launch error) */
    FSDP_DISPATCH(dtype, T, FSDP_ATTN_LAUNCH(attn_bwd_dkv, ROWS, gk, smk, st_, sh.D, (T *)dk, (T *)dv, (const T *)dout,
                                             (const T *)q, (const T *)k, (const T *)v, (const T *)out, lse, rows, sh));
}

// FSDP_ATTN_INSTANCES(extern) declares a kind's launches compiled elsewhere;
// FSDP_ATTN_INSTANCES() compiles them here; _FORWARD_ and _BACKWARD_ one
// direction (a kind whose two directions compile in files of their own)
#define FSDP_ATTN_FORWARD_INSTANCES(EXT, ROWS)                                                                     \
  EXT template void launch_forward<ROWS>(void *, float *, const void *, const void *, const void *, const int32_t *,  \
                                         const Shape &, int32_t, cudaStream_t);
#define FSDP_ATTN_BACKWARD_INSTANCES(EXT, ROWS)                                                                    \
  EXT template void launch_backward<ROWS>(void *, void *, void *, const void *, const void *, const void *,          \
                                          const void *, const void *, const float *, const int32_t *, const Shape &, \
                                          int32_t, cudaStream_t);
#define FSDP_ATTN_INSTANCES(EXT, ROWS) FSDP_ATTN_FORWARD_INSTANCES(EXT, ROWS) FSDP_ATTN_BACKWARD_INSTANCES(EXT, ROWS)

#endif
