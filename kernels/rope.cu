// rope.cu: the CUDA twin of rope.c: rotate-half rotary embedding in place
// on [batch, seq, heads, head_dim], with the fp32 cos/sin tables that
// fsdp_rope_table makes (uploaded once). Backward is the transposed rotation.
#include "common.cuh"

using namespace fsdpk;

// x1' = x1 c - x2 s, x2' = x2 c + x1 s (forward); sign = -1 undoes it
template <typename T>
__global__ void rope_kernel(T *x, const float *cos_t, const float *sin_t, int64_t rows, int64_t seq, int64_t heads,
                            int64_t hd, float sign) {
  int64_t half = hd / 2, total = rows * half;
  for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < total; k += (int64_t)gridDim.x * blockDim.x) {
    int64_t row = k / half, j = k % half;  // row = (b, t, h)
    int64_t t = (row / heads) % seq;
    float c = cos_t[t * hd + j], sn = sign * sin_t[t * hd + j];
    T *p = x + row * hd;
    float x1 = ld(p, j), x2 = ld(p, j + half);
    st(p, j, x1 * c - x2 * sn);
    st(p, j + half, x2 * c + x1 * sn);
  }
}

static int run(void *x, const float *cos_t, const float *sin_t, int64_t batch, int64_t seq, int64_t heads, int64_t hd,
               int32_t dtype, fsdp_stream *s, float sign, const char *what) {
  if (batch < 0 || seq < 0 || heads < 1 || hd < 2 || hd % 2)
    return fsdp_fail(FSDP_EINVAL, "%s: batch %lld, seq %lld, heads %lld, head_dim %lld (even, >= 2)", what, (long long)batch,
                     (long long)seq, (long long)heads, (long long)hd);
  FSDP_CHECK(check_dtype(dtype, what));
  int64_t rows = batch * seq * heads;
  if (rows == 0) return FSDP_OK;
  FSDP_NEED_PTRS(what, x, cos_t, sin_t);
  FSDP_DISPATCH(dtype, T, rope_kernel<T><<<blocks_for(rows * hd / 2, 256), 256, 0, stream_of(s)>>>(
                              (T *)x, cos_t, sin_t, rows, seq, heads, hd, sign));
  return launched(what);
}

extern "C" int fsdp_cuda_rope_forward(void *x, const float *cos_t, const float *sin_t, int64_t batch, int64_t seq,
                                      int64_t heads, int64_t head_dim, fsdp_dtype dtype, fsdp_stream *s) {
  return run(x, cos_t, sin_t, batch, seq, heads, head_dim, dtype, s, 1.0f, "cuda rope forward");
}

extern "C" int fsdp_cuda_rope_backward(void *dx, const float *cos_t, const float *sin_t, int64_t batch, int64_t seq,
                                       int64_t heads, int64_t head_dim, fsdp_dtype dtype, fsdp_stream *s) {
  return run(dx, cos_t, sin_t, batch, seq, heads, head_dim, dtype, s, -1.0f, "cuda rope backward");
}
