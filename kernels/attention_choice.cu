// attention_choice.cu: which attention kernels run a call, and the public
// entry points fsdp_cuda_attention_forward / _backward (and their packed-row
// _docs and positional _pos twins).
//
// AUTO (the default): cuDNN's fused flash attention where it takes the call
// (bf16, head_dim a multiple of 8, libcudnn 9 present, a plan for the
// shape); otherwise OWN: our tensor-core kernels where they apply (bf16,
// head_dim 64 or 128, sm_80+), else our fp32 CUDA-core kernels. CUDNN,
// TENSOR_CORES and SIMPLE ask for one family and fail (EUNSUPPORTED, with
// the reason) where it cannot run, rather than quietly running another.
// The environment's FSDP_ATTENTION=auto|cudnn|own|tc|simple sets the start.
// All three families keep the same lse, so a backward may run on another
// family than its forward did (e.g. cuDNN has a forward plan for a shape
// and no backward one). Packed rows (the _docs entry points) and queries at
// given positions (_pos: a context-parallel rank's rows) run on our fp32
// CUDA-core kernels whatever the choice: the other families take no
// doc_start or q_pos.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_impl.h"
#include "common.cuh"

using namespace fsdpk;

namespace {

int g_impl = -1;

int current_impl(void) {
  if (g_impl < 0) {
    const char *e = getenv("FSDP_ATTENTION");
    g_impl = !e ? FSDP_ATTN_AUTO
             : !strcmp(e, "simple") ? FSDP_ATTN_SIMPLE
             : !strcmp(e, "tc") ? FSDP_ATTN_TENSOR_CORES
             : !strcmp(e, "cudnn") ? FSDP_ATTN_CUDNN
             : !strcmp(e, "own") ? FSDP_ATTN_OWN
                                 : FSDP_ATTN_AUTO;
  }
  return g_impl;
}

// why cuDNN's kernels cannot take these arguments, or NULL
const char *cudnn_refuses(int32_t dtype, int64_t D, const void *const *ptrs, int n) {
  if (dtype != FSDP_BF16) return "cuDNN's fused attention is used for bf16 only";
  if (D % 8 || D > 256) return "cuDNN's fused attention needs head_dim a multiple of 8, at most 256";
  for (int i = 0; i < n; i++)
    if (reinterpret_cast<uintptr_t>(ptrs[i]) & 15u) return "cuDNN's fused attention needs 16-byte aligned buffers";
  return nullptr;
}

// FSDP_ATTN_CUDNN, _TENSOR_CORES or _SIMPLE for this call, or a negative
// status when the family asked for cannot take it; why: the reason cuDNN
// does not take it, when it does not
int choose(int32_t dtype, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int backward,
           const void *const *ptrs, int n, const char *what, char *why, size_t why_len) {
  int want = current_impl();
  snprintf(why, why_len, "not asked for");
  if (want == FSDP_ATTN_SIMPLE) return FSDP_ATTN_SIMPLE;
  if (want == FSDP_ATTN_AUTO || want == FSDP_ATTN_CUDNN) {
    const char *refused = cudnn_refuses(dtype, D, ptrs, n);
    if (refused) snprintf(why, why_len, "%s", refused);
    else if (fsdp_attention_cudnn_applies(B, T, H, Hkv, D, backward, why, why_len)) return FSDP_ATTN_CUDNN;
    if (want == FSDP_ATTN_CUDNN)
      return fsdp_fail(FSDP_EUNSUPPORTED, "%s: cuDNN attention was asked for (FSDP_ATTENTION=cudnn), but %s", what, why);
  }
  if (fsdp_attention_tc_applies(dtype, D, ptrs, n)) return FSDP_ATTN_TENSOR_CORES;
  if (want == FSDP_ATTN_TENSOR_CORES)
    return fsdp_fail(FSDP_EUNSUPPORTED, "%s: the tensor-core kernels need bf16, head_dim 64 or 128, 16-byte aligned "
                     "buffers and a GPU of compute capability 8.0+ (got dtype %d, head_dim %lld)", what, (int)dtype,
                     (long long)D);
  return FSDP_ATTN_SIMPLE;
}

}  // namespace

extern "C" int fsdp_cuda_attention_impl_set(int which) {
  if (which < FSDP_ATTN_AUTO || which > FSDP_ATTN_OWN)
    return fsdp_fail(FSDP_EINVAL, "attention impl %d; expected FSDP_ATTN_AUTO, _SIMPLE, _TENSOR_CORES, _CUDNN or _OWN",
                     which);
  int before = current_impl();
  g_impl = which;
  return before;
}

extern "C" int fsdp_cuda_attention_choice(fsdp_dtype dtype, int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                          int64_t head_dim, int backward, char *desc, size_t desc_len) {
  FSDP_CHECK(fsdp_attention_check_args(batch, seq, heads, kv_heads, head_dim, dtype, "cuda attention choice"));
  char why[384];
  int k = choose(dtype, batch, seq, heads, kv_heads, head_dim, backward, nullptr, 0, "cuda attention choice", why,
                 sizeof why);
  if (k < 0 || !desc || !desc_len) return k;
  if (k == FSDP_ATTN_CUDNN)
    snprintf(desc, desc_len, "cuDNN fused flash attention, %s", fsdp_attention_cudnn_version());
  else
    snprintf(desc, desc_len, "%s (not cuDNN: %s)",
             k == FSDP_ATTN_TENSOR_CORES ? "our tensor-core kernels" : "our fp32 CUDA-core kernels", why);
  return k;
}

extern "C" int fsdp_cuda_attention_workspace(fsdp_dtype dtype, int64_t batch, int64_t seq, int64_t heads,
                                             int64_t kv_heads, int64_t head_dim, int backward, int64_t *bytes) {
  if (!bytes) return fsdp_fail(FSDP_EINVAL, "cuda attention workspace: NULL bytes");
  *bytes = 0;
  FSDP_CHECK(fsdp_attention_check_args(batch, seq, heads, kv_heads, head_dim, dtype, "cuda attention workspace"));
  char why[384];
  int k = choose(dtype, batch, seq, heads, kv_heads, head_dim, backward, nullptr, 0, "cuda attention workspace", why,
                 sizeof why);
  if (k == FSDP_ATTN_CUDNN) { // our own kernels take nothing from the allocator
    const int64_t ws = fsdp_attention_cudnn_workspace(batch, seq, heads, kv_heads, head_dim, backward);
    *bytes = ws > 0 ? ws : 0;
  }
  return k;
}

extern "C" int fsdp_cuda_attention_forward(void *out, float *lse, const void *q, const void *k, const void *v,
                                           int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                           int64_t head_dim, fsdp_dtype dtype, fsdp_stream *s) {
  const char *what = "cuda attention";
  FSDP_CHECK(fsdp_attention_check_args(batch, seq, heads, kv_heads, head_dim, dtype, what));
  if (batch * seq == 0) return FSDP_OK;
  FSDP_NEED_PTRS(what, out, lse, q, k, v);
  const void *ptrs[] = {out, lse, q, k, v};
  char why[384];
  int kind = choose(dtype, batch, seq, heads, kv_heads, head_dim, 0, ptrs, 5, what, why, sizeof why);
  FSDP_CHECK(kind);
  if (kind == FSDP_ATTN_CUDNN)
    return fsdp_attention_cudnn_forward(out, lse, q, k, v, batch, seq, heads, kv_heads, head_dim, stream_of(s));
  if (kind == FSDP_ATTN_TENSOR_CORES)
    return fsdp_attention_tc_forward(out, lse, q, k, v, batch, seq, heads, kv_heads, head_dim, stream_of(s));
  return fsdp_attention_simple_forward(out, lse, q, k, v, nullptr, batch, seq, heads, kv_heads, head_dim, dtype,
                                       stream_of(s));
}

extern "C" int fsdp_cuda_attention_backward(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                                            const void *v, const void *out, const float *lse, int64_t batch,
                                            int64_t seq, int64_t heads, int64_t kv_heads, int64_t head_dim,
                                            fsdp_dtype dtype, fsdp_stream *s) {
  const char *what = "cuda attention backward";
  FSDP_CHECK(fsdp_attention_check_args(batch, seq, heads, kv_heads, head_dim, dtype, what));
  if (batch * seq == 0) return FSDP_OK;
  FSDP_NEED_PTRS(what, dq, dk, dv, dout, q, k, v, out, lse);
  const void *ptrs[] = {dq, dk, dv, dout, q, k, v, out, lse};
  char why[384];
  int kind = choose(dtype, batch, seq, heads, kv_heads, head_dim, 1, ptrs, 9, what, why, sizeof why);
  FSDP_CHECK(kind);
  if (kind == FSDP_ATTN_CUDNN)
    return fsdp_attention_cudnn_backward(dq, dk, dv, dout, q, k, v, out, lse, batch, seq, heads, kv_heads, head_dim,
                                         stream_of(s));
  if (kind == FSDP_ATTN_TENSOR_CORES)
    return fsdp_attention_tc_backward(dq, dk, dv, dout, q, k, v, out, lse, batch, seq, heads, kv_heads, head_dim,
                                      stream_of(s));
  return fsdp_attention_simple_backward(dq, dk, dv, dout, q, k, v, out, lse, nullptr, batch, seq, heads, kv_heads,
                                        head_dim, dtype, stream_of(s));
}

extern "C" int fsdp_cuda_attention_forward_docs(void *out, float *lse, const void *q, const void *k, const void *v,
                                                const int32_t *doc_start, int64_t batch, int64_t seq, int64_t heads,
                                                int64_t kv_heads, int64_t head_dim, fsdp_dtype dtype, fsdp_stream *s) {
  const char *what = "cuda attention docs";
  FSDP_CHECK(fsdp_attention_check_args(batch, seq, heads, kv_heads, head_dim, dtype, what));
  if (batch * seq == 0) return FSDP_OK;
  FSDP_NEED_PTRS(what, out, lse, q, k, v, doc_start);
  return fsdp_attention_simple_forward(out, lse, q, k, v, doc_start, batch, seq, heads, kv_heads, head_dim, dtype,
                                       stream_of(s));
}

extern "C" int fsdp_cuda_attention_backward_docs(void *dq, void *dk, void *dv, const void *dout, const void *q,
                                                 const void *k, const void *v, const void *out, const float *lse,
                                                 const int32_t *doc_start, int64_t batch, int64_t seq, int64_t heads,
                                                 int64_t kv_heads, int64_t head_dim, fsdp_dtype dtype, fsdp_stream *s) {
  const char *what = "cuda attention docs backward";
  FSDP_CHECK(fsdp_attention_check_args(batch, seq, heads, kv_heads, head_dim, dtype, what));
  if (batch * seq == 0) return FSDP_OK;
  FSDP_NEED_PTRS(what, dq, dk, dv, dout, q, k, v, out, lse, doc_start);
  return fsdp_attention_simple_backward(dq, dk, dv, dout, q, k, v, out, lse, doc_start, batch, seq, heads, kv_heads,
                                        head_dim, dtype, stream_of(s));
}

extern "C" int fsdp_cuda_attention_forward_pos(void *out, float *lse, const void *q, const void *k, const void *v,
                                               const int32_t *q_pos, int64_t batch, int64_t tq, int64_t tk,
                                               int64_t heads, int64_t kv_heads, int64_t head_dim, fsdp_dtype dtype,
                                               fsdp_stream *s) {
  const char *what = "cuda attention pos";
  FSDP_CHECK(fsdp_attention_check_args(batch, tq, heads, kv_heads, head_dim, dtype, what));
  if (batch * tq == 0) return FSDP_OK;
  FSDP_NEED_PTRS(what, out, lse, q, k, v, q_pos);
  return fsdp_attention_simple_forward_pos(out, lse, q, k, v, q_pos, batch, tq, tk, heads, kv_heads, head_dim, dtype,
                                           stream_of(s));
}

extern "C" int fsdp_cuda_attention_backward_pos(void *dq, void *dk, void *dv, const void *dout, const void *q,
                                                const void *k, const void *v, const void *out, const float *lse,
                                                const int32_t *q_pos, int64_t batch, int64_t tq, int64_t tk,
                                                int64_t heads, int64_t kv_heads, int64_t head_dim, fsdp_dtype dtype,
                                                fsdp_stream *s) {
  const char *what = "cuda attention pos backward";
  FSDP_CHECK(fsdp_attention_check_args(batch, tq, heads, kv_heads, head_dim, dtype, what));
  if (!batch || (!tk && !tq)) return FSDP_OK; /* (no keys, every query at -1: dq still zeros) */
  FSDP_NEED_PTRS(what, dk, dv, k, v); /* no queries (tq 0): dk, dv zeros */
  if (tq) FSDP_NEED_PTRS(what, dq, dout, q, out, lse, q_pos);
  return fsdp_attention_simple_backward_pos(dq, dk, dv, dout, q, k, v, out, lse, q_pos, batch, tq, tk, heads, kv_heads,
                                            head_dim, dtype, stream_of(s));
}
