/* rmsnorm.c: Hugging Face's LlamaRMSNorm, y = w * x / sqrt(mean(x^2) + eps)
 * over the last dimension, and its backward. The mean of squares is summed
 * in double (rows are up to 8k wide). rstd (1 / rms per row) is saved so
 * the backward is one pass per row:
 *   dx = rstd * (w*dy - xhat * mean(xhat * w*dy)),  xhat = x * rstd.
 * The forward's rows are shared among the rank's CPU threads (each row
 * alone: the same bits); the backward sums dw over rows in order, on one. */
#include <math.h>

#include "../base/error.h"
#include "../base/parallel.h"
#include "../fsdp_ops.h"

static int check_args(const char *op, int64_t n, int64_t dim) {
  if (n < 0 || dim < 1) return fsdp_fail(FSDP_EINVAL, "%s: n=%lld dim=%lld", op, (long long)n, (long long)dim);
  return FSDP_OK;
}

typedef struct norm_job {
  float *y, *rstd;
  const float *x, *w;
  int64_t dim;
  float eps;
} norm_job;

static void forward_rows(void *arg, int64_t lo, int64_t hi) {
  const norm_job *j = arg;
  const int64_t dim = j->dim;
  for (int64_t i = lo; i < hi; i++) {
    const float *xr = j->x + i * dim;
    double ss = 0;
    for (int64_t c = 0; c < dim; c++) ss += (double)xr[c] * xr[c];
    float r = (float)(1.0 / sqrt(ss / (double)dim + (double)j->eps));
    if (j->rstd) j->rstd[i] = r;
    float *yr = j->y + i * dim;
    for (int64_t c = 0; c < dim; c++) yr[c] = j->w[c] * (xr[c] * r);
  }
}

/* rows per thread's share at least: ~64k values */
enum { MIN_VALUES = 1 << 16 };

int fsdp_rmsnorm_forward(float *y, float *rstd, const float *x, const float *w, int64_t n, int64_t dim, float eps) {
  FSDP_CHECK(check_args("rmsnorm_forward", n, dim));
  if (n && (!y || !x || !w)) return fsdp_fail(FSDP_EINVAL, "rmsnorm_forward: NULL buffer");
  if (!(eps >= 0)) return fsdp_fail(FSDP_EINVAL, "rmsnorm_forward: eps = %g", (double)eps);
  norm_job j = {y, rstd, x, w, dim, eps};
  fsdp_parallel_for(n, dim >= MIN_VALUES ? 1 : MIN_VALUES / dim, forward_rows, &j);
  return FSDP_OK;
}

int fsdp_rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd,
                          int64_t n, int64_t dim) {
  FSDP_CHECK(check_args("rmsnorm_backward", n, dim));
  if (n && (!dx || !dy || !x || !w || !rstd)) return fsdp_fail(FSDP_EINVAL, "rmsnorm_backward: NULL buffer");
  for (int64_t i = 0; i < n; i++) {
    const float *xr = x + i * dim, *g = dy + i * dim;
    float r = rstd[i];
    double dot = 0;
    for (int64_t j = 0; j < dim; j++) {
      float xh = xr[j] * r;
      dot += (double)xh * (w[j] * g[j]);
      if (dw) dw[j] += g[j] * xh;
    }
    float m = (float)(dot / (double)dim);
    float *d = dx + i * dim;
    for (int64_t j = 0; j < dim; j++) d[j] = r * (w[j] * g[j] - xr[j] * r * m);
  }
  return FSDP_OK;
}
