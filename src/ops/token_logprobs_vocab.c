/* token_logprobs_vocab.c: token_logprobs.c's log-probabilities, entropies
 * and gradient over logits split by the vocabulary (a tensor-parallel
 * head: rank r holds columns [first, first + cols) of every row), so that
 * no rank ever holds a full row. Three passes around two collectives:
 *   1. fsdp_cross_entropy_vocab_stats: each row's local max and its
 *      target's logit where owned;   -> the max over ranks, the logit summed
 *   2. sums: s = sum e^(x - m) and u = sum e^(x - m) (x - m) over the local
 *      columns;                      -> both summed over the ranks
 *   3. finish: logp = (x_t - m) - log s, entropy = log s - u / s (every rank
 *      the same) and dlogits = coef (onehot(t) - e^(x - m) / s) over the
 *      local columns.
 * u is taken about the max (not sum e^(x - m) x): its terms have one sign
 * and no large logit cancels against the log-sum-exp, as in
 * kernels/token_logprobs.cuh. fp32 with fp32 sums; rows shared among
 * threads, each computing alone (the same bits for any thread count).
 * tests/c/test_token_logprobs_vocab.c holds the passes over 1-4 slices to
 * the whole row's op. */
#include <math.h>
#include <string.h>

#include "../base/error.h"
#include "../base/parallel.h"
#include "../fsdp_ops.h"
#include "rows.h"

typedef struct tlv_job {
  float *logp, *entropy, *dlogits, *sum, *xsum;
  const float *logits, *coef, *row_max, *csum, *cxsum, *target_logit;
  const int32_t *targets;
  int64_t cols, first;
  int32_t ignore_index;
} tlv_job;

static void sums_rows(void *arg, int64_t lo, int64_t hi) {
  const tlv_job *j = arg;
  for (int64_t i = lo; i < hi; i++) {
    const float *x = j->logits + i * j->cols, m = j->row_max[i];
    j->sum[i] = fsdp_row_sum_exp(x, j->cols, m);
    if (!j->xsum) continue;
    float u = 0;
    for (int64_t c = 0; c < j->cols; c++) {
      const float e = expf(x[c] - m);
      if (e > 0.0f) u += e * (x[c] - m); /* e^-inf = 0: no 0 x -inf */
    }
    j->xsum[i] = u;
  }
}

static void finish_rows(void *arg, int64_t lo, int64_t hi) {
  const tlv_job *j = arg;
  for (int64_t i = lo; i < hi; i++) {
    float *d = j->dlogits ? j->dlogits + i * j->cols : NULL;
    const int32_t t = j->targets[i];
    if (t == j->ignore_index) {
      if (j->logp) j->logp[i] = 0;
      if (j->entropy) j->entropy[i] = 0;
      if (d) memset(d, 0, sizeof(float) * (size_t)j->cols);
      continue;
    }
    const float m = j->row_max[i], s = j->csum[i], log_s = logf(s);
    if (j->logp) j->logp[i] = (j->target_logit[i] - m) - log_s;
    if (j->entropy) j->entropy[i] = log_s - j->cxsum[i] / s;
    if (!d) continue;
    const float *x = j->logits + i * j->cols, c = j->coef[i];
    if (d != x) memcpy(d, x, sizeof(float) * (size_t)j->cols);
    fsdp_row_exp_scaled(d, j->cols, m, -c / s);
    if (t >= j->first && t < j->first + j->cols) d[t - j->first] += c;
  }
}

enum { TLV_MIN_ENTRIES = 1 << 16 };

static int64_t grain(int64_t cols) { return cols >= TLV_MIN_ENTRIES ? 1 : TLV_MIN_ENTRIES / cols; }

int fsdp_token_logprobs_vocab_sums(float *sum, float *xsum, const float *logits, const float *row_max, int64_t n,
                                   int64_t cols) {
  if (n < 0 || cols < 1 || (n && (!sum || !logits || !row_max)))
    return fsdp_fail(FSDP_EINVAL, "token_logprobs_vocab_sums: bad arguments (n=%lld cols=%lld)", (long long)n,
                     (long long)cols);
  tlv_job j = {.sum = sum, .xsum = xsum, .logits = logits, .row_max = row_max, .cols = cols};
  fsdp_parallel_for(n, grain(cols), sums_rows, &j);
  return FSDP_OK;
}

int fsdp_token_logprobs_vocab_finish(float *logp, float *entropy, float *dlogits, const float *logits,
                                     const int32_t *targets, const float *coef, const float *row_max, const float *sum,
                                     const float *xsum, const float *target_logit, int64_t n, int64_t vocab,
                                     int64_t first, int64_t cols, int32_t ignore_index) {
  const char *op = "token_logprobs_vocab_finish";
  if (n < 0 || vocab < 1 || cols < 1 || first < 0 || first + cols > vocab)
    return fsdp_fail(FSDP_EINVAL, "%s: bad arguments (n=%lld vocab=%lld columns [%lld, %lld))", op, (long long)n,
                     (long long)vocab, (long long)first, (long long)(first + cols));
  if (n && (!targets || !row_max || !sum || !target_logit || (dlogits && !logits)))
    return fsdp_fail(FSDP_EINVAL, "%s: NULL argument", op);
  if (n && entropy && !xsum) return fsdp_fail(FSDP_EINVAL, "%s: entropy without xsum", op);
  if (n && dlogits && !coef) return fsdp_fail(FSDP_EINVAL, "%s: dlogits without coef", op);
  for (int64_t i = 0; i < n; i++)
    if (targets[i] != ignore_index && (targets[i] < 0 || targets[i] >= vocab))
      return fsdp_fail(FSDP_EINVAL, "%s: target %d in row %lld is outside [0, %lld) and is not the ignore index %d", op,
                       targets[i], (long long)i, (long long)vocab, ignore_index);
  tlv_job j = {.logp = logp, .entropy = entropy, .dlogits = dlogits, .logits = logits, .coef = coef,
               .row_max = row_max, .csum = sum, .cxsum = xsum, .target_logit = target_logit, .targets = targets,
               .cols = cols, .first = first, .ignore_index = ignore_index};
  fsdp_parallel_for(n, grain(cols), finish_rows, &j);
  return FSDP_OK;
}
