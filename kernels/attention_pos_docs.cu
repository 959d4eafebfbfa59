// attention_pos_docs.cu: the CUDA twin of attention_pos_docs.c: queries at
// given positions with a first key each (packed rows under context
// parallelism): q_pos [tq] of tk keys, q_lo [B, tq], query i of batch row b
// seeing keys q_lo[b, i] .. q_pos[i] (q_lo = q_pos + 1: none, out 0, lse
// -inf, dq 0, nothing to dk, dv); k, v, dk, dv [B, tk, Hkv, D].
// attention.cuh's POS_DOCS_ROWS kernels (q_lo through the Shape), compiled
// here alone (attention_launch.cuh), with their public entry points: our
// fp32 CUDA-core kernels run them whatever the impl setting. q_pos and q_lo
// are device memory, checked by the caller on their host copies.
#include "attention_launch.cuh"

FSDP_ATTN_INSTANCES(, POS_DOCS_ROWS)

// tq queries against tk keys (T tq, Tk tk), each from its q_lo
static int check_shape_pos_docs(Shape *sh, const int32_t *q_lo, int64_t B, int64_t tq, int64_t tk, int64_t H,
                                int64_t Hkv, int64_t D, int32_t dtype, const char *what) {
  FSDP_CHECK(check_shape(sh, B, tq, H, Hkv, D, dtype, what));
  if (tk < 0) return fsdp_fail(FSDP_EINVAL, "%s: %lld keys", what, (long long)tk);
  sh->Tk = tk, sh->q_lo = q_lo;
  return FSDP_OK;
}

extern "C" int fsdp_cuda_attention_forward_pos_docs(void *out, float *lse, const void *q, const void *k, const void *v,
                                                    const int32_t *q_pos, const int32_t *q_lo, int64_t batch,
                                                    int64_t tq, int64_t tk, int64_t heads, int64_t kv_heads,
                                                    int64_t head_dim, fsdp_dtype dtype, fsdp_stream *s) {
  const char *what = "cuda attention pos_docs";
  Shape sh;
  FSDP_CHECK(check_shape_pos_docs(&sh, q_lo, batch, tq, tk, heads, kv_heads, head_dim, dtype, what));
  if (batch * tq == 0) return FSDP_OK;
  FSDP_NEED_PTRS(what, out, lse, q, k, v, q_pos, q_lo);
  launch_forward<POS_DOCS_ROWS>(out, lse, q, k, v, q_pos, sh, dtype, stream_of(s));
  return launched("cuda attention pos_docs forward");
}

extern "C" int fsdp_cuda_attention_backward_pos_docs(void *dq, void *dk, void *dv, const void *dout, const void *q,
                                                     const void *k, const void *v, const void *out, const float *lse,
                                                     const int32_t *q_pos, const int32_t *q_lo, int64_t batch,
                                                     int64_t tq, int64_t tk, int64_t heads, int64_t kv_heads,
                                                     int64_t head_dim, fsdp_dtype dtype, fsdp_stream *s) {
  const char *what = "cuda attention pos_docs backward";
  Shape sh;
  FSDP_CHECK(check_shape_pos_docs(&sh, q_lo, batch, tq, tk, heads, kv_heads, head_dim, dtype, what));
  if (!batch || (!tk && !tq)) return FSDP_OK; /* (no keys, every query seeing none: dq still zeros) */
  FSDP_NEED_PTRS(what, dk, dv, k, v);          /* no queries (tq 0): dk, dv zeros */
  if (tq) FSDP_NEED_PTRS(what, dq, dout, q, out, lse, q_pos, q_lo);
  launch_backward<POS_DOCS_ROWS>(dq, dk, dv, dout, q, k, v, out, lse, q_pos, sh, dtype, stream_of(s));
  return launched("cuda attention pos_docs backward");
}
