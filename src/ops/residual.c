/* residual.c: the residual stream's additions. y may alias a or b. */
#include "../base/error.h"
#include "../fsdp_ops.h"

int fsdp_add(float *y, const float *a, const float *b, int64_t n) {
  if (n < 0 || (n && (!y || !a || !b))) return fsdp_fail(FSDP_EINVAL, "add: bad arguments (n=%lld)", (long long)n);
  for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
  return FSDP_OK;
}

int fsdp_scale_add(float *y, float alpha, const float *x, int64_t n) {
  if (n < 0 || (n && (!y || !x))) return fsdp_fail(FSDP_EINVAL, "scale_add: bad arguments (n=%lld)", (long long)n);
  for (int64_t i = 0; i < n; i++) y[i] += alpha * x[i];
  return FSDP_OK;
}
