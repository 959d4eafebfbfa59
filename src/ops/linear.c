/* linear.c: y = x W^T + b on CPU through OpenBLAS (Debian's libopenblas:
 * the optimised, maintained BLAS; hand-written GEMMs would be 10-50x
 * slower). W is [out, in] as in PyTorch and Hugging Face checkpoints.
 * Backward accumulates into the weight and bias grads (beta = 1), as FSDP's
 * grad buffers collect every use of a parameter. fp32. The GEMMs go through
 * fsdp_sgemm (blas_threads.c), which picks their threads by size. */
#include "../base/error.h"
#include "../fsdp_ops.h"
#include "ops.h"

static int check_dims(const char *op, int64_t n, int64_t in, int64_t out) {
  if (n < 0 || in < 1 || out < 1 || n > INT32_MAX || in > INT32_MAX || out > INT32_MAX)
    return fsdp_fail(FSDP_EINVAL, "%s: shape n=%lld in=%lld out=%lld is not valid", op, (long long)n, (long long)in,
                     (long long)out);
  return FSDP_OK;
}

int fsdp_linear_forward(float *y, const float *x, const float *w, const float *b, int64_t n, int64_t in, int64_t out) {
  FSDP_CHECK(check_dims("linear_forward", n, in, out));
  if (!n) return FSDP_OK;
  if (!y || !x || !w) return fsdp_fail(FSDP_EINVAL, "linear_forward: NULL buffer");
  float beta = 0.0f;
  if (b) {
    for (int64_t i = 0; i < n; i++)
      for (int64_t j = 0; j < out; j++) y[i * out + j] = b[j];
    beta = 1.0f;
  }
  fsdp_sgemm(0, 1, n, out, in, 1.0f, x, in, w, in, beta, y, out);
  return FSDP_OK;
}

int fsdp_linear_backward(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w, int64_t n,
                         int64_t in, int64_t out) {
  FSDP_CHECK(check_dims("linear_backward", n, in, out));
  if (!n) return FSDP_OK;
  if (!dy || !x || !w) return fsdp_fail(FSDP_EINVAL, "linear_backward: NULL buffer");
  if (dx) /* dx = dy W */
    fsdp_sgemm(0, 0, n, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
  if (dw) /* dW += dy^T x */
    fsdp_sgemm(1, 0, out, in, n, 1.0f, dy, out, x, in, 1.0f, dw, in);
  if (db)
    for (int64_t i = 0; i < n; i++)
      for (int64_t j = 0; j < out; j++) db[j] += dy[i * out + j];
  return FSDP_OK;
}
