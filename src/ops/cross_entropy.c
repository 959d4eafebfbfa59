/* cross_entropy.c: softmax cross-entropy over the vocabulary, fused with its
 * gradient: one row at a time, the log-sum-exp (max-shifted), the loss, then
 * dlogits = scale * (softmax - onehot) written over the row, which may be the
 * logits themselves: the largest tensor of a language model is then never
 * held twice. Rows whose target is ignore_index count for nothing and get a
 * zero gradient.
 *
 * fp32 arithmetic with fp32 sums, as the CUDA kernel does, through the
 * vectorised row loops of rows.c. Only the loss total over rows is a
 * double. tests/c/test_cross_entropy.c holds it to float64 (vocab 37 and
 * 32003). */
#include <math.h>
#include <string.h>

#include "../base/error.h"
#include "../fsdp_ops.h"
#include "rows.h"

int fsdp_cross_entropy(double *loss_sum, int64_t *count, float *dlogits, const float *logits, const int32_t *targets,
                       int64_t n, int64_t vocab, int32_t ignore_index, float grad_scale) {
  if (n < 0 || vocab < 1 || !loss_sum || !count || (n && (!logits || !targets)))
    return fsdp_fail(FSDP_EINVAL, "cross_entropy: bad arguments (n=%lld vocab=%lld)", (long long)n, (long long)vocab);
  for (int64_t i = 0; i < n; i++)
    if (targets[i] != ignore_index && (targets[i] < 0 || targets[i] >= vocab))
      return fsdp_fail(FSDP_EINVAL, "cross_entropy: target %d in row %lld is outside [0, %lld) and is not the ignore index %d",
                       targets[i], (long long)i, (long long)vocab, ignore_index);
  double total = 0;
  int64_t cnt = 0;
  for (int64_t i = 0; i < n; i++) {
    const float *x = logits + i * vocab;
    float *d = dlogits ? dlogits + i * vocab : NULL;
    const int32_t t = targets[i];
    if (t == ignore_index) {
      if (d) memset(d, 0, sizeof(float) * (size_t)vocab);
      continue;
    }
    const float m = fsdp_row_max(x, vocab), xt = x[t]; /* x[t] read: the row may be overwritten */
    float sum;
    if (d) { /* one exponential per entry: d = e^(x - m), then scaled by grad_scale / sum */
      if (d != x) memcpy(d, x, sizeof(float) * (size_t)vocab);
      sum = fsdp_row_exp_sum(d, vocab, m);
      fsdp_row_scale(d, vocab, grad_scale / sum);
      d[t] -= grad_scale;
    } else {
      sum = fsdp_row_sum_exp(x, vocab, m);
    }
    total += (double)(m + logf(sum)) - xt;
    cnt++;
  }
  *loss_sum = total;
  *count = cnt;
  return FSDP_OK;
}
