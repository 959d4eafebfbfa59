// rope.cu: the CUDA twin of rope.c: rotate-half rotary embedding in place
// on [batch, seq, heads, head_dim], with the fp32 cos/sin tables that
// fsdp_rope_table makes (uploaded once). Backward is the transposed rotation.
// The _at calls (packed rows) take each (b, t)'s table row from pos [batch,
// seq] on the device; the kernel is rope.cuh's.
#include "common.cuh"

using namespace fsdpk;

#include "rope.cuh"

using namespace fsdp_rope;

static int run(void *x, const float *cos_t, const float *sin_t, const int32_t *pos, int at, int64_t batch, int64_t seq,
               int64_t heads, int64_t hd, int32_t dtype, fsdp_stream *s, float sign, const char *what) {
  if (batch < 0 || seq < 0 || heads < 1 || hd < 2 || hd % 2)
    return fsdp_fail(FSDP_EINVAL, "%s: batch %lld, seq %lld, heads %lld, head_dim %lld (even, >= 2)", what, (long long)batch,
                     (long long)seq, (long long)heads, (long long)hd);
  FSDP_CHECK(check_dtype(dtype, what));
  int64_t rows = batch * seq * heads;
  if (rows == 0) return FSDP_OK;
  FSDP_NEED_PTRS(what, x, cos_t, sin_t);
  if (at) FSDP_NEED_PTRS(what, pos);
  const unsigned blocks = blocks_for(rows * hd / 2, 256);
  if (at)
    FSDP_DISPATCH(dtype, T, rope_kernel<T, true><<<blocks, 256, 0, stream_of(s)>>>((T *)x, cos_t, sin_t, pos, rows, seq,
                                                                                    heads, hd, sign));
  else
    FSDP_DISPATCH(dtype, T, rope_kernel<T, false><<<blocks, 256, 0, stream_of(s)>>>((T *)x, cos_t, sin_t, nullptr, rows,
                                                                                     seq, heads, hd, sign));
  return launched(what);
}

extern "C" int fsdp_cuda_rope_forward(void *x, const float *cos_t, const float *sin_t, int64_t batch, int64_t seq,
                                      int64_t heads, int64_t head_dim, fsdp_dtype dtype, fsdp_stream *s) {
  return run(x, cos_t, sin_t, nullptr, 0, batch, seq, heads, head_dim, dtype, s, 1.0f, "cuda rope forward");
}

extern "C" int fsdp_cuda_rope_backward(void *dx, const float *cos_t, const float *sin_t, int64_t batch, int64_t seq,
                                       int64_t heads, int64_t head_dim, fsdp_dtype dtype, fsdp_stream *s) {
  return run(dx, cos_t, sin_t, nullptr, 0, batch, seq, heads, head_dim, dtype, s, -1.0f, "cuda rope backward");
}

extern "C" int fsdp_cuda_rope_forward_at(void *x, const float *cos_t, const float *sin_t, const int32_t *pos,
                                         int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, fsdp_dtype dtype,
                                         fsdp_stream *s) {
  return run(x, cos_t, sin_t, pos, 1, batch, seq, heads, head_dim, dtype, s, 1.0f, "cuda rope forward_at");
}

extern "C" int fsdp_cuda_rope_backward_at(void *dx, const float *cos_t, const float *sin_t, const int32_t *pos,
                                          int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, fsdp_dtype dtype,
                                          fsdp_stream *s) {
  return run(dx, cos_t, sin_t, pos, 1, batch, seq, heads, head_dim, dtype, s, -1.0f, "cuda rope backward_at");
}
