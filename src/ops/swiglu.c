/* swiglu.c: Llama's MLP activation y = silu(gate) * up, silu(g) = g * sigmoid(g),
 * and its backward in one pass:
 *   dgate = dy * up * s * (1 + g * (1 - s)),  dup = dy * g * s,  s = sigmoid(g),
 * which may write over gate and up (the MLP's backward does: two
 * intermediate-sized buffers fewer at its peak).
 * The sigmoid comes from rows.c's vectorised exponential, a chunk at a time
 * (scalar expf took 8% of the demo's step in a profile). */
#include "../base/error.h"
#include "../fsdp_ops.h"
#include "rows.h"

enum { CHUNK = 512 }; /* sigmoids on the stack at a time */

int fsdp_swiglu_forward(float *y, const float *gate, const float *up, int64_t n) {
  if (n < 0 || (n && (!y || !gate || !up))) return fsdp_fail(FSDP_EINVAL, "swiglu_forward: bad arguments (n=%lld)", (long long)n);
  float s[CHUNK];
  for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
    int64_t m = n - i0 < CHUNK ? n - i0 : CHUNK;
    const float *g = gate + i0, *u = up + i0;
    fsdp_row_sigmoid(s, g, m);
    for (int64_t i = 0; i < m; i++) y[i0 + i] = g[i] * s[i] * u[i];
  }
  return FSDP_OK;
}

int fsdp_swiglu_backward(float *dgate, float *dup, const float *dy, const float *gate, const float *up, int64_t n) {
  if (n < 0 || (n && (!dgate || !dup || !dy || !gate || !up)))
    return fsdp_fail(FSDP_EINVAL, "swiglu_backward: bad arguments (n=%lld)", (long long)n);
  float s[CHUNK];
  for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
    int64_t m = n - i0 < CHUNK ? n - i0 : CHUNK;
    const float *g = gate + i0, *u = up + i0, *d = dy + i0;
    fsdp_row_sigmoid(s, g, m);
    for (int64_t i = 0; i < m; i++) { /* read before written: dgate, dup may be gate, up (in place) */
      float gi = g[i], ui = u[i], di = d[i];
      dup[i0 + i] = di * gi * s[i];
      dgate[i0 + i] = di * ui * s[i] * (1.0f + gi * (1.0f - s[i]));
    }
  }
  return FSDP_OK;
}
