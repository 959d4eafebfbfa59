/* token_logprobs.c: per-token log-probabilities and entropies of the
 * targets, and the gradient of a loss written over them (post-training:
 * a policy loss, DPO; fsdp.engine). For row i with target t_i:
 *   logp_i = x_it - lse_i,   entropy_i = lse_i - sum_j p_ij x_ij,
 *   dlogits_i = coef_i (onehot(t_i) - p_i),  coef_i = dL/dlogp_i,
 * p_i = softmax(x_i). Rows whose target is ignore_index get 0 in all three.
 * Taken about the row's max m: logp = (x_t - m) - log s, entropy = log s -
 * sum_j e^(x_j - m) (x_j - m) / s, s = sum_j e^(x_j - m): every term has one
 * sign, so large logits lose no digits against the log-sum-exp (as
 * kernels/token_logprobs.cuh), and a logit of -inf adds nothing.
 * dlogits may be the logits themselves (written in place, as
 * cross_entropy.c does: the full logits are never held twice). fp32 with
 * the vectorised row loops of rows.c; rows shared among the rank's CPU
 * threads, each computing alone (the same bits for any thread count).
 * tests/c/test_token_logprobs.c holds it to float64. */
#include <math.h>
#include <string.h>

#include "../base/error.h"
#include "../base/parallel.h"
#include "../fsdp_ops.h"
#include "rows.h"

typedef struct tl_job {
  float *logp, *entropy, *dlogits;
  const float *logits, *coef;
  const int32_t *targets;
  int64_t vocab;
  int32_t ignore_index;
} tl_job;

static void tl_rows(void *arg, int64_t lo, int64_t hi) {
  const tl_job *j = arg;
  const int64_t V = j->vocab;
  for (int64_t i = lo; i < hi; i++) {
    const float *x = j->logits + i * V;
    float *d = j->dlogits ? j->dlogits + i * V : NULL;
    const int32_t t = j->targets[i];
    if (t == j->ignore_index) {
      if (j->logp) j->logp[i] = 0;
      if (j->entropy) j->entropy[i] = 0;
      if (d) memset(d, 0, sizeof(float) * (size_t)V);
      continue;
    }
    const float m = fsdp_row_max(x, V), xt = x[t];
    float u = 0; /* sum_j e^(x_j - m) (x_j - m), for the entropy (read before d overwrites x) */
    if (j->entropy)
      for (int64_t c = 0; c < V; c++) {
        const float e = expf(x[c] - m);
        if (e > 0.0f) u += e * (x[c] - m); /* e^-inf = 0: no 0 x -inf */
      }
    float sum;
    if (d) { /* d = e^(x - m), then -coef / sum times it, plus coef at the target */
      if (d != x) memcpy(d, x, sizeof(float) * (size_t)V);
      sum = fsdp_row_exp_sum(d, V, m);
      const float c = j->coef ? j->coef[i] : 0.0f;
      fsdp_row_scale(d, V, -c / sum);
      d[t] += c;
    } else {
      sum = fsdp_row_sum_exp(x, V, m);
    }
    const float log_s = logf(sum);
    if (j->logp) j->logp[i] = (xt - m) - log_s;
    if (j->entropy) j->entropy[i] = log_s - u / sum;
  }
}

enum { TL_MIN_ENTRIES = 1 << 16 };

int fsdp_token_logprobs(float *logp, float *entropy, float *dlogits, const float *logits, const int32_t *targets,
                        const float *coef, int64_t n, int64_t vocab, int32_t ignore_index) {
  if (n < 0 || vocab < 1 || (n && (!logits || !targets)) || (dlogits && !coef && n))
    return fsdp_fail(FSDP_EINVAL, "token_logprobs: bad arguments (n=%lld vocab=%lld%s)", (long long)n, (long long)vocab,
                     dlogits && !coef ? ", dlogits without coef" : "");
  for (int64_t i = 0; i < n; i++)
    if (targets[i] != ignore_index && (targets[i] < 0 || targets[i] >= vocab))
      return fsdp_fail(FSDP_EINVAL, "token_logprobs: target %d in row %lld is outside [0, %lld) and is not the ignore index %d",
                       targets[i], (long long)i, (long long)vocab, ignore_index);
  tl_job j = {logp, entropy, dlogits, logits, coef, targets, vocab, ignore_index};
  fsdp_parallel_for(n, vocab >= TL_MIN_ENTRIES ? 1 : TL_MIN_ENTRIES / vocab, tl_rows, &j);
  return FSDP_OK;
}
