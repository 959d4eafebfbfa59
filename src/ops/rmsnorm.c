/* rmsnorm.c: Hugging Face's LlamaRMSNorm, y = w * x / sqrt(mean(x^2) + eps)
 * over the last dimension, and its backward. The mean of squares is summed
 * in double (rows are up to 8k wide). rstd (1 / rms per row) is saved so
 * the backward is one pass per row:
 *   dx = rstd * (w*dy - xhat * mean(xhat * w*dy)),  xhat = x * rstd.
 * Rows are shared among the rank's CPU threads. Each row alone gives the
 * same bits for any thread count; the backward's dw is summed per block of
 * rows (blocks fixed by n, not by the threads), then the blocks in order. */
#include <math.h>
#include <stdlib.h>

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

typedef struct norm_bwd_job {
  float *dx, *partial; /* partial: one dw row per block of rows, or NULL */
  const float *dy, *x, *w, *rstd;
  int64_t n, dim, block_rows;
} norm_bwd_job;

static void backward_blocks(void *arg, int64_t lo, int64_t hi) {
  const norm_bwd_job *j = arg;
  const int64_t dim = j->dim;
  const float *w = j->w;
  for (int64_t b = lo; b < hi; b++) {
    float *pw = j->partial ? j->partial + b * dim : NULL;
    if (pw)
      for (int64_t c = 0; c < dim; c++) pw[c] = 0;
    const int64_t end = (b + 1) * j->block_rows < j->n ? (b + 1) * j->block_rows : j->n;
    for (int64_t i = b * j->block_rows; i < end; i++) {
      const float *xr = j->x + i * dim, *g = j->dy + i * dim;
      const float r = j->rstd[i];
      double dot = 0;
      for (int64_t c = 0; c < dim; c++) {
        float xh = xr[c] * r;
        dot += (double)xh * (w[c] * g[c]);
        if (pw) pw[c] += g[c] * xh;
      }
      const float m = (float)(dot / (double)dim);
      float *d = j->dx + i * dim;
      for (int64_t c = 0; c < dim; c++) d[c] = r * (w[c] * g[c] - xr[c] * r * m);
    }
  }
}

typedef struct dw_sum_job {
  float *dw;
  const float *partial;
  int64_t blocks, dim;
} dw_sum_job;

/* columns [lo, hi) of dw += the blocks' partial rows, in block order */
static void sum_dw_columns(void *arg, int64_t lo, int64_t hi) {
  const dw_sum_job *j = arg;
  for (int64_t c = lo; c < hi; c++) {
    float s = 0;
    for (int64_t b = 0; b < j->blocks; b++) s += j->partial[b * j->dim + c];
    j->dw[c] += s;
  }
}

/* at most this many blocks of rows: the partial sums' memory (64 x dim) */
enum { MAX_BLOCKS = 64 };

int fsdp_rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd,
                          int64_t n, int64_t dim) {
  FSDP_CHECK(check_args("rmsnorm_backward", n, dim));
  if (n && (!dx || !dy || !x || !w || !rstd)) return fsdp_fail(FSDP_EINVAL, "rmsnorm_backward: NULL buffer");
  if (n == 0) return FSDP_OK;
  const int64_t block_rows = (n + MAX_BLOCKS - 1) / MAX_BLOCKS, blocks = (n + block_rows - 1) / block_rows;
  float *partial = NULL;
  if (dw && !(partial = malloc((size_t)(blocks * dim) * sizeof(float))))
    return fsdp_fail(FSDP_ENOMEM, "rmsnorm_backward: %lld x %lld partial sums of dw", (long long)blocks, (long long)dim);
  norm_bwd_job j = {dx, partial, dy, x, w, rstd, n, dim, block_rows};
  const int64_t per_block = block_rows * dim;
  fsdp_parallel_for(blocks, per_block >= MIN_VALUES ? 1 : (MIN_VALUES + per_block - 1) / per_block, backward_blocks, &j);
  if (partial) {
    dw_sum_job sj = {dw, partial, blocks, dim};
    fsdp_parallel_for(dim, blocks >= MIN_VALUES ? 1 : (MIN_VALUES + blocks - 1) / blocks, sum_dw_columns, &sj);
    free(partial);
  }
  return FSDP_OK;
}
