// attention_pos.cu: the CUDA twins of attention_pos.c and
// attention_pos_docs.c: queries at given positions (context parallelism):
// q_pos [tq] of tk keys, each in [-1, tk), query i of batch row b seeing
// keys q_lo[b, i] .. q_pos[i] (the _pos calls: q_lo NULL, from key 0;
// the _pos_docs calls: packed rows, q_lo [B, tq], q_lo = q_pos + 1 seeing
// none); a query that sees none: out 0, lse -inf, dq 0, nothing to dk,
// dv. k, v, dk, dv [B, tk, Hkv, D]. attention.cuh's POS_DOCS_ROWS kernels
// (q_lo through the Shape), compiled here alone (attention_launch.cuh),
// the backward's in attention_backward_pos.cu: the heaviest of the kinds
// (99 s of nvcc on 2 cores in one file), in two halves nvcc builds side by side.
// q_pos and q_lo are device memory, checked by the callers on their host
// copies; the _pos_docs entry points run our fp32 CUDA-core kernels
// whatever the impl setting (the _pos ones are attention_choice.cu's).
#include "attention_launch.cuh"

FSDP_ATTN_FORWARD_INSTANCES(, POS_DOCS_ROWS)
FSDP_ATTN_BACKWARD_INSTANCES(extern, POS_DOCS_ROWS)

// tq queries at positions of tk keys (T tq, Tk tk), each from its q_lo (or NULL: 0)
static int check_shape_pos(Shape *sh, const int32_t *q_lo, int64_t B, int64_t tq, int64_t tk, int64_t H, int64_t Hkv,
                           int64_t D, int32_t dtype, const char *what) {
  FSDP_CHECK(check_shape(sh, B, tq, H, Hkv, D, dtype, what));
  if (tk < 0) return fsdp_fail(FSDP_EINVAL, "%s: %lld keys", what, (long long)tk);
  sh->Tk = tk, sh->q_lo = q_lo;
  return FSDP_OK;
}

static int forward_pos(void *out, float *lse, const void *q, const void *k, const void *v, const int32_t *q_pos,
                       const int32_t *q_lo, int64_t batch, int64_t tq, int64_t tk, int64_t heads, int64_t kv_heads,
                       int64_t head_dim, int32_t dtype, cudaStream_t st, const char *what) {
  Shape sh;
  FSDP_CHECK(check_shape_pos(&sh, q_lo, batch, tq, tk, heads, kv_heads, head_dim, dtype, what));
  if (batch * tq == 0) return FSDP_OK;
  launch_forward<POS_DOCS_ROWS>(out, lse, q, k, v, q_pos, sh, dtype, st);
  return launched(what);
}

static int backward_pos(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k, const void *v,
                        const void *out, const float *lse, const int32_t *q_pos, const int32_t *q_lo, int64_t batch,
                        int64_t tq, int64_t tk, int64_t heads, int64_t kv_heads, int64_t head_dim, int32_t dtype,
                        cudaStream_t st, const char *what) {
  Shape sh;
  FSDP_CHECK(check_shape_pos(&sh, q_lo, batch, tq, tk, heads, kv_heads, head_dim, dtype, what));
  if (!batch || (!tk && !tq)) return FSDP_OK; /* (no keys, every query seeing none: dq still zeros) */
  launch_backward<POS_DOCS_ROWS>(dq, dk, dv, dout, q, k, v, out, lse, q_pos, sh, dtype, st);
  return launched(what);
}

extern "C" int fsdp_attention_simple_forward_pos(void *out, float *lse, const void *q, const void *k, const void *v,
                                                 const int32_t *q_pos, int64_t batch, int64_t tq, int64_t tk,
                                                 int64_t heads, int64_t kv_heads, int64_t head_dim, int32_t dtype,
                                                 void *stream) {
  return forward_pos(out, lse, q, k, v, q_pos, nullptr, batch, tq, tk, heads, kv_heads, head_dim, dtype,
                     static_cast<cudaStream_t>(stream), "cuda attention pos forward");
}

extern "C" int fsdp_attention_simple_backward_pos(void *dq, void *dk, void *dv, const void *dout, const void *q,
                                                  const void *k, const void *v, const void *out, const float *lse,
                                                  const int32_t *q_pos, int64_t batch, int64_t tq, int64_t tk,
                                                  int64_t heads, int64_t kv_heads, int64_t head_dim, int32_t dtype,
                                                  void *stream) {
  return backward_pos(dq, dk, dv, dout, q, k, v, out, lse, q_pos, nullptr, batch, tq, tk, heads, kv_heads, head_dim,
                      dtype, static_cast<cudaStream_t>(stream), "cuda attention pos backward");
}

extern "C" int fsdp_cuda_attention_forward_pos_docs(void *out, float *lse, const void *q, const void *k, const void *v,
                                                    const int32_t *q_pos, const int32_t *q_lo, int64_t batch,
                                                    int64_t tq, int64_t tk, int64_t heads, int64_t kv_heads,
                                                    int64_t head_dim, fsdp_dtype dtype, fsdp_stream *s) {
  const char *what = "cuda attention pos_docs";
  if (batch && tq) FSDP_NEED_PTRS(what, out, lse, q, k, v, q_pos, q_lo);
  return forward_pos(out, lse, q, k, v, q_pos, q_lo, batch, tq, tk, heads, kv_heads, head_dim, dtype, stream_of(s),
                     what);
}

extern "C" int fsdp_cuda_attention_backward_pos_docs(void *dq, void *dk, void *dv, const void *dout, const void *q,
                                                     const void *k, const void *v, const void *out, const float *lse,
                                                     const int32_t *q_pos, const int32_t *q_lo, int64_t batch,
                                                     int64_t tq, int64_t tk, int64_t heads, int64_t kv_heads,
                                                     int64_t head_dim, fsdp_dtype dtype, fsdp_stream *s) {
  const char *what = "cuda attention pos_docs backward";
  if (batch && (tk || tq)) {
    FSDP_NEED_PTRS(what, dk, dv, k, v); /* no queries (tq 0): dk, dv zeros */
    if (tq) FSDP_NEED_PTRS(what, dq, dout, q, out, lse, q_pos, q_lo);
  }
  return backward_pos(dq, dk, dv, dout, q, k, v, out, lse, q_pos, q_lo, batch, tq, tk, heads, kv_heads, head_dim, dtype,
                      stream_of(s), what);
}
