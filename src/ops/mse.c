/* mse.c: mean squared error, L = sum (x - t)^2 / n, and its gradient
 * dx = scale * 2 (x - t) / n (scale: 1 / micro-batches for accumulation).
 * The sum runs in float64. fp32. */
#include "../base/error.h"
#include "../fsdp_ops.h"

int fsdp_mse_forward_backward(double *loss, float *dx, const float *x, const float *target, int64_t n, float scale) {
  if (n < 1 || !x || !target || !loss) return fsdp_fail(FSDP_EINVAL, "mse: bad arguments (n = %lld)", (long long)n);
  double s = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = (double)x[i] - target[i];
    s += d * d;
    if (dx) dx[i] = (float)(scale * 2.0 * d / (double)n);
  }
  *loss = s / (double)n;
  return FSDP_OK;
}
