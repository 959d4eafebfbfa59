// attention.cu: the CUDA twin of attention.c: causal attention with grouped
// query heads, flash-style: the T x T scores never exist in memory. Forward
// keeps one query row per thread with an online softmax and saves the
// log-sum-exp; backward recomputes the probabilities from it, one kernel for
// dq (a thread per query row) and one for dk, dv (a thread per key row,
// looping over its group's query heads), so nothing needs atomics.
// fp32 arithmetic on CUDA cores, any head_dim up to 256, fp32 or bf16: the
// fallback for what cuDNN (attention_cudnn.cpp) and our tensor-core kernels
// (attention_tc.cu) do not take; attention_choice.cu picks per call. Packed
// rows (doc_start not NULL: query i sees keys doc_start[i] .. i) run here
// alone, in the kernels' DOCS instances (attention.cuh, which
// tests/emu/test_attention_docs_emu.cpp runs on the CPU); doc_start NULL
// runs the causal instances, the code as it was. Queries at given
// positions (context parallelism: q_pos [T] of Tk keys, each in [-1, Tk):
// -1 sees no key, out 0, lse -inf; the _pos entry points) run the POS
// instances.
// Layouts: q, out, dq, dout [B, T, H, D]; k, v, dk, dv [B, T, Hkv, D]; lse
// [B, H, T]; doc_start [B, T] int32 (POS: k, v, dk, dv [B, Tk, Hkv, D];
// q_pos [T] int32).
#include <stdlib.h>
#include <string.h>

#include "attention_impl.h"
#include "common.cuh"

using namespace fsdpk;

#define FSDP_ATTN_SHARED(name) extern __shared__ float name[]
#include "attention.cuh"

using namespace fsdp_attn;

extern "C" int fsdp_attention_check_args(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int32_t dtype,
                                         const char *what) {
  if (B < 0 || T < 0 || H < 1 || Hkv < 1 || H % Hkv || D < 1 || D > 256 || B > 65535 || H > 65535)
    return fsdp_fail(FSDP_EINVAL, "%s: batch %lld, seq %lld, heads %lld, kv heads %lld (dividing heads), head_dim %lld (1..256)",
                     what, (long long)B, (long long)T, (long long)H, (long long)Hkv, (long long)D);
  return check_dtype(dtype, what);
}

static int check_shape(Shape *sh, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int32_t dtype, const char *what) {
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

// rows: doc_start (DOCS_ROWS), q_pos (POS_ROWS) or NULL (CAUSAL)
template <int ROWS>
static void launch_forward(void *out, float *lse, const void *q, const void *k, const void *v, const int32_t *rows,
                           const Shape &sh, int32_t dtype, cudaStream_t st_) {
  dim3 grid((unsigned)((sh.T + QROWS - 1) / QROWS), (unsigned)sh.H, (unsigned)sh.B);
  size_t smem = sizeof(float) * (QROWS * (sh.D + 1) + 2 * KTILE * sh.D);
  FSDP_DISPATCH(dtype, T, FSDP_ATTN_LAUNCH(attn_fwd, ROWS, grid, smem, st_, sh.D, (T *)out, lse, (const T *)q,
                                           (const T *)k, (const T *)v, rows, sh));
}

template <int ROWS>
static void launch_backward(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k, const void *v,
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

extern "C" int fsdp_attention_simple_forward(void *out, float *lse, const void *q, const void *k, const void *v,
                                             const int32_t *doc_start, int64_t batch, int64_t seq, int64_t heads,
                                             int64_t kv_heads, int64_t head_dim, int32_t dtype, void *stream) {
  Shape sh;
  FSDP_CHECK(check_shape(&sh, batch, seq, heads, kv_heads, head_dim, dtype, "cuda attention"));
  if (batch * seq == 0) return FSDP_OK;
  cudaStream_t st_ = static_cast<cudaStream_t>(stream);
  if (doc_start) launch_forward<DOCS_ROWS>(out, lse, q, k, v, doc_start, sh, dtype, st_);
  else launch_forward<CAUSAL>(out, lse, q, k, v, nullptr, sh, dtype, st_);
  return launched("cuda attention forward");
}

extern "C" int fsdp_attention_simple_backward(void *dq, void *dk, void *dv, const void *dout, const void *q,
                                              const void *k, const void *v, const void *out, const float *lse,
                                              const int32_t *doc_start, int64_t batch, int64_t seq, int64_t heads,
                                              int64_t kv_heads, int64_t head_dim, int32_t dtype, void *stream) {
  Shape sh;
  FSDP_CHECK(check_shape(&sh, batch, seq, heads, kv_heads, head_dim, dtype, "cuda attention backward"));
  if (batch * seq == 0) return FSDP_OK;
  cudaStream_t st_ = static_cast<cudaStream_t>(stream);
  if (doc_start) launch_backward<DOCS_ROWS>(dq, dk, dv, dout, q, k, v, out, lse, doc_start, sh, dtype, st_);
  else launch_backward<CAUSAL>(dq, dk, dv, dout, q, k, v, out, lse, nullptr, sh, dtype, st_);
  return launched("cuda attention backward");
}

// queries at positions q_pos [tq] of tk keys: the shape's T is tq, its Tk tk
static int check_shape_pos(Shape *sh, int64_t B, int64_t tq, int64_t tk, int64_t H, int64_t Hkv, int64_t D,
                           int32_t dtype, const char *what) {
  FSDP_CHECK(check_shape(sh, B, tq, H, Hkv, D, dtype, what));
  if (tk < 0) return fsdp_fail(FSDP_EINVAL, "%s: %lld keys", what, (long long)tk);
  sh->Tk = tk;
  return FSDP_OK;
}

extern "C" int fsdp_attention_simple_forward_pos(void *out, float *lse, const void *q, const void *k, const void *v,
                                                 const int32_t *q_pos, int64_t batch, int64_t tq, int64_t tk,
                                                 int64_t heads, int64_t kv_heads, int64_t head_dim, int32_t dtype,
                                                 void *stream) {
  Shape sh;
  FSDP_CHECK(check_shape_pos(&sh, batch, tq, tk, heads, kv_heads, head_dim, dtype, "cuda attention pos"));
  if (batch * tq == 0) return FSDP_OK;
  launch_forward<POS_ROWS>(out, lse, q, k, v, q_pos, sh, dtype, static_cast<cudaStream_t>(stream));
  return launched("cuda attention pos forward");
}

extern "C" int fsdp_attention_simple_backward_pos(void *dq, void *dk, void *dv, const void *dout, const void *q,
                                                  const void *k, const void *v, const void *out, const float *lse,
                                                  const int32_t *q_pos, int64_t batch, int64_t tq, int64_t tk,
                                                  int64_t heads, int64_t kv_heads, int64_t head_dim, int32_t dtype,
                                                  void *stream) {
  Shape sh;
  FSDP_CHECK(check_shape_pos(&sh, batch, tq, tk, heads, kv_heads, head_dim, dtype, "cuda attention pos backward"));
  if (!batch || (!tk && !tq)) return FSDP_OK; /* (no keys: dq still zeros) */
  launch_backward<POS_ROWS>(dq, dk, dv, dout, q, k, v, out, lse, q_pos, sh, dtype, static_cast<cudaStream_t>(stream));
  return launched("cuda attention pos backward");
}
