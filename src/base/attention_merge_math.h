/* attention_merge_math.h: one row of fsdp_attention_merge (ring attention's
 * combine of two partial results by their log-sum-exp), shared by the CPU
 * op (src/ops/attention_merge.c) and the CUDA kernel (kernels/
 * attention_merge.cuh) so that both compute the same formula. In base,
 * below both: numerics that two layers share. */
#ifndef FSDP_ATTENTION_MERGE_MATH_H
#define FSDP_ATTENTION_MERGE_MATH_H

#include <math.h>

#include "host_device.h"

/* what a row's merge does to the accumulator's out row */
enum { FSDP_MERGE_KEEP = 0, FSDP_MERGE_COPY = 1, FSDP_MERGE_BLEND = 2 };

/* The accumulator's row (its lse) and the partial's (lse_b): KEEP when the
 * partial saw no key (lse_b = -inf; so also when neither did), COPY when
 * only the partial did (lse = -inf: its out_b row and lse_b are taken as
 * they are), else BLEND: out = wa out + wb out_b, *merged the new lse.
 * KEEP and COPY never read the unseen side's out row, so no NaN or garbage
 * there can leak in, and the seen side comes through bit for bit. */
static inline FSDP_HOST_DEVICE int fsdp_attention_merge_row(float lse, float lse_b, float *wa, float *wb, float *merged) {
  if (lse_b == -INFINITY) return FSDP_MERGE_KEEP;
  if (lse == -INFINITY) {
    *merged = lse_b;
    return FSDP_MERGE_COPY;
  }
  const float m = lse > lse_b ? lse : lse_b;
  /* one of a, b is exactly 1: s in [1, 2], no overflow, no division by 0 */
  const float a = expf(lse - m), b = expf(lse_b - m), s = a + b;
  *wa = a / s;
  *wb = b / s;
  *merged = m + logf(s);
  return FSDP_MERGE_BLEND;
}

#endif
