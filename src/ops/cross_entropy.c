/* cross_entropy.c: softmax cross-entropy over the vocabulary, fused with its
 * gradient: one row at a time, the log-sum-exp (max-shifted), the loss, then
 * dlogits = scale * (softmax - onehot) written over the row, which may be the
 * logits themselves: the largest tensor of a language model is then never
 * held twice. Rows whose target is ignore_index count for nothing and get a
 * zero gradient.
 *
 * fp32 arithmetic with fp32 sums, as the CUDA kernel does, in loops the
 * compiler vectorises: the exponential is exp_nonpos below, branch-free;
 * the max and the sum keep LANES running results (lane l takes entries
 * l, l + LANES, ...) combined in a fixed order, so a vector of any width
 * gives the same bits as the plain loop. CMakeLists.txt builds this file
 * with -O3 -fno-math-errno -fno-trapping-math (the last lets GCC turn the
 * selects into vector blends; no result changes), and GCC adds an AVX2
 * clone of each loop on x86-64. Only the loss total over rows is a double.
 * tests/c/test_cross_entropy.c holds it to float64 (vocab 37 and 32003). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../base/error.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FSDP_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FSDP_VECTOR_CLONES
#endif

enum { LANES = 16 };

/* e^x for x <= 0 (x - max, x - lse): x = n ln2 + r with |r| <= ln2 / 2
 * (ln2 split in two, so n ln2 is exact), e^r by its Taylor polynomial of
 * degree 7 (truncation < 6e-9 relative), 2^n put in the exponent bits.
 * Within a few ulp of expf; below -87 (e^x < 1.7e-38, near the smallest
 * normal float) 0; NaN stays NaN. n is rounded by adding 1.5 * 2^23, whose
 * low mantissa bits are then n + 2^22: shifted left by 23 they are n in
 * the exponent field (mod 2^32, unsigned): no float-to-int conversion. */
static inline float exp_nonpos(float x) {
  const float c = x < -87.0f ? -87.0f : x;
  const float shifter = 12582912.0f; /* 1.5 * 2^23 */
  const float t = c * 1.44269504088896341f + shifter;
  const float n = t - shifter;
  const float r = (c - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  uint32_t bits;
  float scale;
  memcpy(&bits, &t, sizeof bits);
  bits = (bits << 23) + 0x3f800000u; /* 2^n: n + 127 in the exponent */
  memcpy(&scale, &bits, sizeof scale);
  return x < -87.0f ? 0.0f : p * scale;
}

/* the largest logit (a NaN logit does not count here, but it makes the sum,
 * and so the loss, NaN) */
FSDP_VECTOR_CLONES static float row_max(const float *x, int64_t n) {
  float m[LANES];
  for (int l = 0; l < LANES; l++) m[l] = -INFINITY;
  int64_t j = 0;
  for (; j + LANES <= n; j += LANES) {
#pragma GCC unroll 1 /* kept a loop, so that it is vectorised (unrolled, its selects would not be) */
    for (int l = 0; l < LANES; l++) m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
  }
  for (; j < n; j++) m[0] = x[j] > m[0] ? x[j] : m[0];
  float r = m[0];
  for (int l = 1; l < LANES; l++) r = m[l] > r ? m[l] : r;
  return r;
}

/* sum_j e^(x_j - m) in fp32 */
FSDP_VECTOR_CLONES static float row_sum_exp(const float *x, int64_t n, float m) {
  float s[LANES] = {0};
  int64_t j = 0;
  for (; j + LANES <= n; j += LANES)
    for (int l = 0; l < LANES; l++) s[l] += exp_nonpos(x[j + l] - m);
  for (; j < n; j++) s[0] += exp_nonpos(x[j] - m);
  float r = 0;
  for (int l = 0; l < LANES; l++) r += s[l];
  return r;
}

/* d_j <- scale e^(d_j - lse), in place */
FSDP_VECTOR_CLONES static void row_softmax_scaled(float *d, int64_t n, float lse, float scale) {
  for (int64_t j = 0; j < n; j++) d[j] = scale * exp_nonpos(d[j] - lse);
}

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
    const float m = row_max(x, vocab);
    const float lse = m + logf(row_sum_exp(x, vocab, m));
    total += (double)lse - x[t];
    cnt++;
    if (d) { /* x[t] is read: the row may now be overwritten */
      if (d != x) memcpy(d, x, sizeof(float) * (size_t)vocab);
      row_softmax_scaled(d, vocab, lse, grad_scale);
      d[t] -= grad_scale;
    }
  }
  *loss_sum = total;
  *count = cnt;
  return FSDP_OK;
}
