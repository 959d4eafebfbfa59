// attention_pos.cu: the CUDA twin of attention_pos.c: queries at given
// positions (context parallelism): q_pos [T] of Tk keys, each in [-1, Tk),
// query i sees keys 0 .. q_pos[i] (-1: none, out 0 and lse -inf); k, v,
// dk, dv [B, Tk, Hkv, D]. attention.cuh's POS_ROWS kernels, compiled here
// alone (attention_launch.cuh).
#include "attention_launch.cuh"

FSDP_ATTN_INSTANCES(, POS_ROWS)

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
