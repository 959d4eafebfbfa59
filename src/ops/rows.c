/* rows.c: the softmax's loops over one row, in fp32 (rows.h): the
 * cross-entropy's over the vocabulary, attention's over the keys; and the
 * sigmoid of SwiGLU (swiglu.c), the other user of the exponential. Loops the
 * compiler vectorises: the exponential is exp_nonpos below, branch-free;
 * the max and the sum keep LANES running results (lane l takes entries
 * l, l + LANES, ...) combined in a fixed order, so a vector of any width
 * gives the same bits as the plain loop. CMakeLists.txt builds this file
 * with -O3 -fno-math-errno -fno-trapping-math (the last lets GCC turn the
 * selects into vector blends; no result changes), and GCC adds an AVX2
 * clone of each loop on x86-64. Tested through its users
 * (tests/c/test_cross_entropy.c checks the exponential over its range). */
#include <math.h>
#include <string.h>

#include "rows.h"
#include "../fsdp_ops.h"

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

FSDP_VECTOR_CLONES float fsdp_row_max(const float *x, int64_t n) {
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

FSDP_VECTOR_CLONES float fsdp_row_sum_exp(const float *x, int64_t n, float m) {
  float s[LANES] = {0};
  int64_t j = 0;
  for (; j + LANES <= n; j += LANES)
    for (int l = 0; l < LANES; l++) s[l] += exp_nonpos(x[j + l] - m);
  for (; j < n; j++) s[0] += exp_nonpos(x[j] - m);
  float r = 0;
  for (int l = 0; l < LANES; l++) r += s[l];
  return r;
}

FSDP_VECTOR_CLONES float fsdp_row_exp_sum(float *x, int64_t n, float m) {
  float s[LANES] = {0};
  int64_t j = 0;
  for (; j + LANES <= n; j += LANES)
    for (int l = 0; l < LANES; l++) {
      x[j + l] = exp_nonpos(x[j + l] - m);
      s[l] += x[j + l];
    }
  for (; j < n; j++) {
    x[j] = exp_nonpos(x[j] - m);
    s[0] += x[j];
  }
  float r = 0;
  for (int l = 0; l < LANES; l++) r += s[l];
  return r;
}

FSDP_VECTOR_CLONES void fsdp_row_scale(float *x, int64_t n, float scale) {
  for (int64_t j = 0; j < n; j++) x[j] *= scale;
}

FSDP_VECTOR_CLONES void fsdp_row_exp_scaled(float *x, int64_t n, float shift, float scale) {
  for (int64_t j = 0; j < n; j++) x[j] = scale * exp_nonpos(x[j] - shift);
}


FSDP_VECTOR_CLONES void fsdp_row_softmax_grad(float *dp, const float *p, int64_t n, float di) {
  for (int64_t j = 0; j < n; j++) dp[j] = p[j] * (dp[j] - di);
}

/* sigmoid(x) = 1 / (1 + e^-x) from e^-|x|, which cannot overflow: 1 / (1 + e)
 * for x >= 0, e / (1 + e) below. NaN stays NaN. */
FSDP_VECTOR_CLONES void fsdp_row_sigmoid(float *s, const float *x, int64_t n) {
  for (int64_t j = 0; j < n; j++) {
    const float v = x[j];
    const float e = exp_nonpos(v < 0 ? v : -v);
    const float r = 1.0f / (1.0f + e);
    s[j] = v < 0 ? e * r : r;
  }
}
