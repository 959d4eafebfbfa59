/* tanh.c: the activation of the engine's test models; backward from the
 * forward's output (dy * (1 - y^2)), so nothing else needs keeping. fp32. */
#include <math.h>

#include "../base/error.h"
#include "../fsdp_ops.h"

int fsdp_tanh_forward(float *y, const float *x, int64_t n) {
  if (n < 0 || (n && (!y || !x))) return fsdp_fail(FSDP_EINVAL, "tanh_forward: bad arguments");
  for (int64_t i = 0; i < n; i++) y[i] = tanhf(x[i]);
  return FSDP_OK;
}

int fsdp_tanh_backward(float *dx, const float *dy, const float *y, int64_t n) {
  if (n < 0 || (n && (!dx || !dy || !y))) return fsdp_fail(FSDP_EINVAL, "tanh_backward: bad arguments");
  for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * (1.0f - y[i] * y[i]);
  return FSDP_OK;
}
