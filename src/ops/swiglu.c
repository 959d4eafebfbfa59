/* swiglu.c: Llama's MLP activation y = silu(gate) * up, silu(g) = g * sigmoid(g),
 * and its backward in one pass:
 *   dgate = dy * up * s * (1 + g * (1 - s)),  dup = dy * g * s,  s = sigmoid(g). */
#include <math.h>

#include "../base/error.h"

int fsdp_swiglu_forward(float *y, const float *gate, const float *up, int64_t n) {
  if (n < 0 || (n && (!y || !gate || !up))) return fsdp_fail(FSDP_EINVAL, "swiglu_forward: bad arguments (n=%lld)", (long long)n);
  for (int64_t i = 0; i < n; i++) {
    float g = gate[i];
    y[i] = g / (1.0f + expf(-g)) * up[i];
  }
  return FSDP_OK;
}

int fsdp_swiglu_backward(float *dgate, float *dup, const float *dy, const float *gate, const float *up, int64_t n) {
  if (n < 0 || (n && (!dgate || !dup || !dy || !gate || !up)))
    return fsdp_fail(FSDP_EINVAL, "swiglu_backward: bad arguments (n=%lld)", (long long)n);
  for (int64_t i = 0; i < n; i++) {
    float g = gate[i], s = 1.0f / (1.0f + expf(-g));
    float d = dy[i];
    dup[i] = d * g * s;
    dgate[i] = d * up[i] * s * (1.0f + g * (1.0f - s));
  }
  return FSDP_OK;
}
