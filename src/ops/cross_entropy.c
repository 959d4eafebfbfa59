/* cross_entropy.c: softmax cross-entropy over the vocabulary, fused with its
 * gradient: one row at a time, the log-sum-exp (max-shifted), the loss, then
 * dlogits = scale * (softmax - onehot) written over the row, which may be the
 * logits themselves: the largest tensor of a language model is then never
 * held twice. Rows whose target is ignore_index count for nothing and get a
 * zero gradient.
 *
 * fp32 arithmetic with fp32 sums, as the CUDA kernel does, through the
 * vectorised row loops of rows.c. Only the loss total over rows is a
 * double, summed in row order. Rows are shared among the rank's CPU
 * threads (each row computes alone: the same bits for any thread count).
 * tests/c/test_cross_entropy.c holds it to float64 (vocab 37 and 32003). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "../base/parallel.h"
#include "../fsdp_ops.h"
#include "rows.h"

/* one call's buffers; each row's loss lands in row_loss[row] */
typedef struct ce_job {
  double *row_loss;
  float *dlogits;
  const float *logits;
  const int32_t *targets;
  int64_t vocab;
  int32_t ignore_index;
  float grad_scale;
} ce_job;

static void ce_rows(void *arg, int64_t lo, int64_t hi) {
  const ce_job *j = arg;
  const int64_t vocab = j->vocab;
  for (int64_t i = lo; i < hi; i++) {
    const float *x = j->logits + i * vocab;
    float *d = j->dlogits ? j->dlogits + i * vocab : NULL;
    const int32_t t = j->targets[i];
    if (t == j->ignore_index) {
      if (d) memset(d, 0, sizeof(float) * (size_t)vocab);
      continue;
    }
    const float m = fsdp_row_max(x, vocab), xt = x[t]; /* x[t] read: the row may be overwritten */
    float sum;
    if (d) { /* one exponential per entry: d = e^(x - m), then scaled by grad_scale / sum */
      if (d != x) memcpy(d, x, sizeof(float) * (size_t)vocab);
      sum = fsdp_row_exp_sum(d, vocab, m);
      fsdp_row_scale(d, vocab, j->grad_scale / sum);
      d[t] -= j->grad_scale;
    } else {
      sum = fsdp_row_sum_exp(x, vocab, m);
    }
    j->row_loss[i] = (double)(m + logf(sum)) - xt;
  }
}

/* rows per thread's chunk: at least ~64k entries, a few microseconds */
enum { CE_MIN_ENTRIES = 1 << 16 };

int fsdp_cross_entropy(double *loss_sum, int64_t *count, float *dlogits, const float *logits, const int32_t *targets,
                       int64_t n, int64_t vocab, int32_t ignore_index, float grad_scale) {
  if (n < 0 || vocab < 1 || !loss_sum || !count || (n && (!logits || !targets)))
    return fsdp_fail(FSDP_EINVAL, "cross_entropy: bad arguments (n=%lld vocab=%lld)", (long long)n, (long long)vocab);
  for (int64_t i = 0; i < n; i++)
    if (targets[i] != ignore_index && (targets[i] < 0 || targets[i] >= vocab))
      return fsdp_fail(FSDP_EINVAL, "cross_entropy: target %d in row %lld is outside [0, %lld) and is not the ignore index %d",
                       targets[i], (long long)i, (long long)vocab, ignore_index);
  ce_job j = {malloc(sizeof(double) * (size_t)(n > 0 ? n : 1)), dlogits, logits, targets, vocab, ignore_index, grad_scale};
  if (!j.row_loss) return fsdp_fail(FSDP_ENOMEM, "cross_entropy: no memory for %lld rows' losses", (long long)n);
  fsdp_parallel_for(n, vocab >= CE_MIN_ENTRIES ? 1 : CE_MIN_ENTRIES / vocab, ce_rows, &j);
  double total = 0; /* summed in row order: the same bits for any thread count */
  int64_t cnt = 0;
  for (int64_t i = 0; i < n; i++)
    if (targets[i] != ignore_index) total += j.row_loss[i], cnt++;
  free(j.row_loss);
  *loss_sum = total;
  *count = cnt;
  return FSDP_OK;
}
