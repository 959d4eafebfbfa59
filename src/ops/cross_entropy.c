/* cross_entropy.c: softmax cross-entropy over the vocabulary, fused with its
 * gradient: one row at a time, the log-sum-exp (max-shifted, summed in
 * double), the loss, then dlogits = scale * (softmax - onehot) written over
 * the row, which may be the logits themselves: the largest tensor of a
 * language model is then never held twice. Rows whose target is
 * ignore_index count for nothing and get a zero gradient. */
#include <math.h>

#include "../base/error.h"

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
    if (targets[i] == ignore_index) {
      for (int64_t j = 0; d && j < vocab; j++) d[j] = 0;
      continue;
    }
    float m = x[0];
    for (int64_t j = 1; j < vocab; j++) m = x[j] > m ? x[j] : m;
    double s = 0;
    for (int64_t j = 0; j < vocab; j++) s += exp((double)x[j] - m);
    double lse = m + log(s);
    total += lse - x[targets[i]];
    cnt++;
    if (d) {
      int32_t t = targets[i];
      for (int64_t j = 0; j < vocab; j++) d[j] = grad_scale * (float)exp((double)x[j] - lse);
      d[t] -= grad_scale;
    }
  }
  *loss_sum = total;
  *count = cnt;
  return FSDP_OK;
}
