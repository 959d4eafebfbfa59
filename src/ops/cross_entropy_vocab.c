/* cross_entropy_vocab.c: the softmax cross-entropy of logits split over
 * the vocabulary (a tensor-parallel head: rank r holds columns [first,
 * first + cols) of every row), in three passes around two small
 * collectives, so that no rank ever holds a full row (Megatron's
 * vocab-parallel cross-entropy):
 *   1. each row's local max, and its target's logit where this rank holds
 *      it (else 0);          -> the max over ranks; the target logit summed
 *   2. the row's sum of exp(x - max) over the local columns;  -> summed
 *   3. the loss (max + log sum - x_t, the same on every rank) and
 *      dlogits = scale (softmax - onehot) over the local columns.
 * fp32 with fp32 sums as cross_entropy.c; rows shared among threads.
 * tests/c/test_cross_entropy_vocab.c holds the passes over 1-4 slices
 * to the whole row's op. */
#include <math.h>
#include <string.h>

#include "../base/error.h"
#include "../base/parallel.h"
#include "../fsdp_ops.h"
#include "rows.h"

typedef struct vce_job {
  float *row_max, *target_logit, *sum;
  float *dlogits;
  const float *logits;
  const int32_t *targets;
  int64_t cols, first;
  int32_t ignore_index;
  float grad_scale;
} vce_job;

static int owned(const vce_job *j, int32_t t) { return t != j->ignore_index && t >= j->first && t < j->first + j->cols; }

static void stats_rows(void *arg, int64_t lo, int64_t hi) {
  const vce_job *j = arg;
  for (int64_t i = lo; i < hi; i++) {
    const float *x = j->logits + i * j->cols;
    j->row_max[i] = fsdp_row_max(x, j->cols);
    j->target_logit[i] = owned(j, j->targets[i]) ? x[j->targets[i] - j->first] : 0.0f;
  }
}

static void sum_rows(void *arg, int64_t lo, int64_t hi) {
  const vce_job *j = arg;
  for (int64_t i = lo; i < hi; i++) j->sum[i] = fsdp_row_sum_exp(j->logits + i * j->cols, j->cols, j->row_max[i]);
}

static void grad_rows(void *arg, int64_t lo, int64_t hi) {
  const vce_job *j = arg;
  for (int64_t i = lo; i < hi; i++) {
    float *d = j->dlogits + i * j->cols;
    const int32_t t = j->targets[i];
    if (t == j->ignore_index) {
      memset(d, 0, sizeof(float) * (size_t)j->cols);
      continue;
    }
    if (d != j->logits + i * j->cols) memcpy(d, j->logits + i * j->cols, sizeof(float) * (size_t)j->cols);
    fsdp_row_exp_scaled(d, j->cols, j->row_max[i], j->grad_scale / j->sum[i]);
    if (owned(j, t)) d[t - j->first] -= j->grad_scale;
  }
}

enum { VCE_MIN_ENTRIES = 1 << 16 };

static int check_common(const char *op, const float *logits, const int32_t *targets, int64_t n, int64_t vocab,
                        int64_t first, int64_t cols, int32_t ignore_index) {
  if (n < 0 || vocab < 1 || cols < 1 || first < 0 || first + cols > vocab || (n && (!logits || !targets)))
    return fsdp_fail(FSDP_EINVAL, "%s: bad arguments (n=%lld vocab=%lld columns [%lld, %lld))", op, (long long)n,
                     (long long)vocab, (long long)first, (long long)(first + cols));
  for (int64_t i = 0; i < n; i++)
    if (targets[i] != ignore_index && (targets[i] < 0 || targets[i] >= vocab))
      return fsdp_fail(FSDP_EINVAL, "%s: target %d in row %lld is outside [0, %lld) and is not the ignore index %d", op,
                       targets[i], (long long)i, (long long)vocab, ignore_index);
  return FSDP_OK;
}

static int64_t grain(int64_t cols) { return cols >= VCE_MIN_ENTRIES ? 1 : VCE_MIN_ENTRIES / cols; }

int fsdp_cross_entropy_vocab_stats(float *row_max, float *target_logit, const float *logits, const int32_t *targets,
                                   int64_t n, int64_t vocab, int64_t first, int64_t cols, int32_t ignore_index) {
  FSDP_CHECK(check_common("cross_entropy_vocab_stats", logits, targets, n, vocab, first, cols, ignore_index));
  if (n && (!row_max || !target_logit)) return fsdp_fail(FSDP_EINVAL, "cross_entropy_vocab_stats: NULL output");
  vce_job j = {.row_max = row_max, .target_logit = target_logit, .logits = logits, .targets = targets, .cols = cols,
               .first = first, .ignore_index = ignore_index};
  fsdp_parallel_for(n, grain(cols), stats_rows, &j);
  return FSDP_OK;
}

int fsdp_cross_entropy_vocab_sum(float *sum, const float *logits, const float *row_max, int64_t n, int64_t cols) {
  if (n < 0 || cols < 1 || (n && (!sum || !logits || !row_max)))
    return fsdp_fail(FSDP_EINVAL, "cross_entropy_vocab_sum: bad arguments (n=%lld cols=%lld)", (long long)n, (long long)cols);
  vce_job j = {.sum = sum, .logits = logits, .row_max = (float *)row_max, .cols = cols};
  fsdp_parallel_for(n, grain(cols), sum_rows, &j);
  return FSDP_OK;
}

int fsdp_cross_entropy_vocab_finish(double *loss_sum, int64_t *count, float *dlogits, const float *logits,
                                    const int32_t *targets, const float *row_max, const float *sum,
                                    const float *target_logit, int64_t n, int64_t vocab, int64_t first, int64_t cols,
                                    int32_t ignore_index, float grad_scale) {
  FSDP_CHECK(check_common("cross_entropy_vocab_finish", logits, targets, n, vocab, first, cols, ignore_index));
  if (!loss_sum || !count || (n && (!row_max || !sum || !target_logit)))
    return fsdp_fail(FSDP_EINVAL, "cross_entropy_vocab_finish: NULL argument");
  double total = 0; /* in row order, as cross_entropy.c */
  int64_t cnt = 0;
  for (int64_t i = 0; i < n; i++)
    if (targets[i] != ignore_index) total += (double)(row_max[i] + logf(sum[i])) - target_logit[i], cnt++;
  *loss_sum = total;
  *count = cnt;
  if (!dlogits) return FSDP_OK;
  vce_job j = {.row_max = (float *)row_max, .sum = (float *)sum, .dlogits = dlogits, .logits = logits, .targets = targets,
               .cols = cols, .first = first, .ignore_index = ignore_index, .grad_scale = grad_scale};
  fsdp_parallel_for(n, grain(cols), grad_rows, &j);
  return FSDP_OK;
}
