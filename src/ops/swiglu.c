/* swiglu.c: Llama's MLP activation y = silu(gate) * up, silu(g) = g * sigmoid(g),
 * and its backward in one pass:
 *   dgate = dy * up * s * (1 + g * (1 - s)),  dup = dy * g * s,  s = sigmoid(g),
 * which may write over gate and up (the MLP's backward does: two
 * intermediate-sized buffers fewer at its peak).
 * The sigmoid comes from rows.c's vectorised exponential, a chunk at a time
 * (scalar expf took 8% of the demo's step in a profile). Elementwise, so
 * shared among the rank's CPU threads in any split with the same bits. */
#include "../base/error.h"
#include "../base/parallel.h"
#include "../fsdp_ops.h"
#include "rows.h"

enum { CHUNK = 512 };             /* sigmoids on the stack at a time */
enum { GRAIN = 1 << 15 };         /* elements per thread's share at least */

typedef struct swiglu_job {
  float *y, *dgate, *dup;
  const float *gate, *up, *dy;
} swiglu_job;

static void forward_range(void *arg, int64_t lo, int64_t hi) {
  const swiglu_job *j = arg;
  float s[CHUNK];
  for (int64_t i0 = lo; i0 < hi; i0 += CHUNK) {
    int64_t m = hi - i0 < CHUNK ? hi - i0 : CHUNK;
    const float *g = j->gate + i0, *u = j->up + i0;
    fsdp_row_sigmoid(s, g, m);
    for (int64_t i = 0; i < m; i++) j->y[i0 + i] = g[i] * s[i] * u[i];
  }
}

int fsdp_swiglu_forward(float *y, const float *gate, const float *up, int64_t n) {
  if (n < 0 || (n && (!y || !gate || !up))) return fsdp_fail(FSDP_EINVAL, "swiglu_forward: bad arguments (n=%lld)", (long long)n);
  swiglu_job j = {.y = y, .gate = gate, .up = up};
  fsdp_parallel_for(n, GRAIN, forward_range, &j);
  return FSDP_OK;
}

static void backward_range(void *arg, int64_t lo, int64_t hi) {
  const swiglu_job *j = arg;
  float s[CHUNK];
  for (int64_t i0 = lo; i0 < hi; i0 += CHUNK) {
    int64_t m = hi - i0 < CHUNK ? hi - i0 : CHUNK;
    const float *g = j->gate + i0, *u = j->up + i0, *d = j->dy + i0;
    fsdp_row_sigmoid(s, g, m);
    for (int64_t i = 0; i < m; i++) { /* read before written: dgate, dup may be gate, up (in place) */
      float gi = g[i], ui = u[i], di = d[i];
      j->dup[i0 + i] = di * gi * s[i];
      j->dgate[i0 + i] = di * ui * s[i] * (1.0f + gi * (1.0f - s[i]));
    }
  }
}

int fsdp_swiglu_backward(float *dgate, float *dup, const float *dy, const float *gate, const float *up, int64_t n) {
  if (n < 0 || (n && (!dgate || !dup || !dy || !gate || !up)))
    return fsdp_fail(FSDP_EINVAL, "swiglu_backward: bad arguments (n=%lld)", (long long)n);
  swiglu_job j = {.dgate = dgate, .dup = dup, .dy = dy, .gate = gate, .up = up};
  fsdp_parallel_for(n, GRAIN, backward_range, &j);
  return FSDP_OK;
}
