/* test_optim: AdamW and SGD on flat shards against float64 references over
 * 20 steps of pseudo-random gradients; sum of squares against float64.
 * Tolerance: 2e-6 relative + 1e-7 absolute on the parameters (fp32
 * arithmetic vs float64, errors grow slowly with steps); the bf16 copy must
 * equal the rounded fp32 value exactly. Split params (the bf16 copy plus
 * 16 low bits) against the fp32 ones: the same bits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/bf16_split.h"
#include "check.h"
#include "fsdp.h"

enum { N = 10007, STEPS = 20 };

static float grad_at(int step, int i) { return (float)sin(0.37 * i + 1.3 * step) * (float)(1 + i % 7); }

static void test_adamw(float wd, float scale) {
  fsdp_adamw_config cfg = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = wd};
  float *p = malloc(N * 4), *g = malloc(N * 4), *m = calloc(N, 4), *v = calloc(N, 4);
  uint16_t *pb = malloc(N * 2);
  double *rp = malloc(N * 8), *rm = calloc(N, 8), *rv = calloc(N, 8);
  for (int i = 0; i < N; i++) p[i] = (float)(rp[i] = 0.01 * cos(i));
  int bad = 0;
  for (int t = 1; t <= STEPS; t++) {
    for (int i = 0; i < N; i++) g[i] = grad_at(t, i);
    CHECK_OK(fsdp_adamw_step(p, pb, NULL, g, FSDP_FP32, m, v, N, t, &cfg, scale));
    for (int i = 0; i < N; i++) {
      double gi = (double)g[i] * scale;
      rp[i] *= 1.0 - (double)cfg.lr * cfg.weight_decay;
      rm[i] = 0.9 * rm[i] + 0.1 * gi;
      rv[i] = 0.999 * rv[i] + 0.001 * gi * gi;
      double mh = rm[i] / (1 - pow(0.9, t)), vh = rv[i] / (1 - pow(0.999, t));
      rp[i] -= 1e-3 * mh / (sqrt(vh) + 1e-8);
    }
  }
  for (int i = 0; i < N; i++) {
    if (!(fabs(p[i] - rp[i]) <= 2e-6 * fabs(rp[i]) + 1e-7)) {
      if (bad++ < 3) fprintf(stderr, "adamw[%d] = %.9g, expected %.9g\n", i, p[i], rp[i]);
    }
    if (pb[i] != fsdp_bf16_round_away(p[i])) bad++;
  }
  CHECK(bad == 0);
  /* the first step moves each parameter by about lr (bias correction at t = 1) */
  float q = 0, gq = 1, mq = 0, vq = 0;
  fsdp_adamw_config plain = {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0};
  CHECK_OK(fsdp_adamw_step(&q, NULL, NULL, &gq, FSDP_FP32, &mq, &vq, 1, 1, &plain, 1.0f));
  CHECK(fabsf(q + 0.1f) < 1e-6f);
  free(p); free(g); free(m); free(v); free(pb); free(rp); free(rm); free(rv);
}

static void test_sgd(void) {
  float *p = malloc(N * 4), *g = malloc(N * 4), *buf = calloc(N, 4);
  double *rp = malloc(N * 8), *rb = calloc(N, 8);
  for (int i = 0; i < N; i++) p[i] = (float)(rp[i] = 0.5 * sin(i));
  for (int t = 1; t <= STEPS; t++) {
    for (int i = 0; i < N; i++) g[i] = grad_at(t, i);
    CHECK_OK(fsdp_sgd_step(p, NULL, NULL, g, FSDP_FP32, buf, N, t, 0.01f, 0.9f, 1e-4f, 0.5f));
    for (int i = 0; i < N; i++) {
      double gi = (double)g[i] * 0.5 + 1e-4 * rp[i];
      rb[i] = t == 1 ? gi : 0.9 * rb[i] + gi;
      rp[i] -= 0.01 * rb[i];
    }
  }
  int bad = 0;
  for (int i = 0; i < N; i++) bad += !(fabs(p[i] - rp[i]) <= 2e-6 * fabs(rp[i]) + 1e-6);
  CHECK(bad == 0);
  free(p); free(g); free(buf); free(rp); free(rb);
}

/* a shard big enough to be split over threads gives exactly the values of
 * the single-threaded loop (the update is elementwise) */
static void test_adamw_threads(void) {
  enum { BIG = 1000003 };
  fsdp_adamw_config cfg = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  float *p[2], *m[2], *v[2], *g = malloc(BIG * 4);
  uint16_t *pb[2];
  for (int k = 0; k < 2; k++) {
    p[k] = malloc(BIG * 4), m[k] = calloc(BIG, 4), v[k] = calloc(BIG, 4), pb[k] = malloc(BIG * 2);
    for (int i = 0; i < BIG; i++) p[k][i] = 0.01f * (float)cos(i);
  }
  for (int t = 1; t <= 3; t++) {
    for (int i = 0; i < BIG; i++) g[i] = grad_at(t, i);
    for (int k = 0; k < 2; k++) {
      CHECK_OK(fsdp_cpu_threads_set(k == 0 ? 1 : 4));
      CHECK_OK(fsdp_adamw_step(p[k], pb[k], NULL, g, FSDP_FP32, m[k], v[k], BIG, t, &cfg, 0.5f));
    }
  }
  CHECK(fsdp_cpu_threads() == 4);
  CHECK(!memcmp(p[0], p[1], BIG * 4) && !memcmp(m[0], m[1], BIG * 4) && !memcmp(v[0], v[1], BIG * 4) &&
        !memcmp(pb[0], pb[1], BIG * 2));
  CHECK_FAILS(fsdp_cpu_threads_set(0), FSDP_EINVAL, "expected >= 1");
  for (int k = 0; k < 2; k++) free(p[k]), free(m[k]), free(v[k]), free(pb[k]);
  free(g);
}

/* bf16_split.h over bit patterns: every float comes back from its halves;
 * the high half is the nearest bf16, round-to-nearest-even's but at ties */
static void test_split_bits(void) {
  int bad = 0, ties = 0;
  uint32_t r = 12345;
  for (int64_t k = 0; k < 4000000; k++) {
    r = r * 1664525u + 1013904223u;
    /* every exponent and sign; low halves near 0x8000 and the ends often */
    uint32_t u = k < 65536 ? 0x3f800000u + (uint32_t)k : k % 4 == 0 ? (r & 0xffff0000u) | (0x7ffeu + ((r >> 20) & 3)) : r;
    float f;
    memcpy(&f, &u, 4);
    uint16_t h = fsdp_bf16_round_away(f), l = fsdp_bf16_low(f);
    float back = fsdp_bf16_join(h, l);
    if (isnan(f)) {
      bad += !isnan(back) || !isnan(fsdp_bf16_to_f32(h));
      continue;
    }
    bad += memcmp(&back, &f, 4) != 0;
    int tie = (u & 0xffffu) == 0x8000u;
    ties += tie;
    uint16_t even = fsdp_f32_to_bf16(f);
    /* at a tie: away from zero, one bf16 ulp off the even one at most */
    bad += tie ? (h != (uint16_t)((u >> 16) + 1) || (h != even && (uint16_t)(h - 1) != even)) : h != even;
  }
  CHECK(bad == 0 && ties > 1000);
}

/* AdamW and SGD on split params: the fp32 path's params and bf16 copy, bit
 * for bit, over 20 steps; a shard split over threads for AdamW */
static void test_split_steps(void) {
  enum { BIG = 1000003 };
  fsdp_adamw_config cfg = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  float *p = malloc(BIG * 4), *g = malloc(BIG * 4), *m[2], *v[2];
  uint16_t *pb = malloc(BIG * 2), *hi = malloc(BIG * 2), *lo = malloc(BIG * 2);
  for (int k = 0; k < 2; k++) m[k] = calloc(BIG, 4), v[k] = calloc(BIG, 4);
  for (int i = 0; i < BIG; i++) {
    /* ties (low half 0x8000) among them */
    p[i] = i % 5 == 0 ? fsdp_bf16_join((uint16_t)(0x3c00 + i % 4096), 0x8000) : 0.01f * (float)cos(i);
    hi[i] = fsdp_bf16_round_away(p[i]), lo[i] = fsdp_bf16_low(p[i]);
  }
  int threads = fsdp_cpu_threads();
  for (int t = 1; t <= STEPS; t++) {
    for (int i = 0; i < BIG; i++) g[i] = grad_at(t, i);
    CHECK_OK(fsdp_cpu_threads_set(1));
    CHECK_OK(fsdp_adamw_step(p, pb, NULL, g, FSDP_FP32, m[0], v[0], BIG, t, &cfg, 0.5f));
    CHECK_OK(fsdp_cpu_threads_set(4));
    CHECK_OK(fsdp_adamw_step(NULL, hi, lo, g, FSDP_FP32, m[1], v[1], BIG, t, &cfg, 0.5f));
  }
  fsdp_cpu_threads_set(threads);
  int bad = 0;
  for (int i = 0; i < BIG; i++) {
    float joined = fsdp_bf16_join(hi[i], lo[i]);
    bad += memcmp(&joined, &p[i], 4) != 0 || hi[i] != pb[i];
  }
  CHECK(bad == 0 && !memcmp(m[0], m[1], BIG * 4) && !memcmp(v[0], v[1], BIG * 4));
  for (int t = 1; t <= STEPS; t++) {
    for (int i = 0; i < N; i++) g[i] = grad_at(t, i);
    CHECK_OK(fsdp_sgd_step(p, pb, NULL, g, FSDP_FP32, m[0], N, t, 0.01f, 0.9f, 1e-4f, 0.5f));
    CHECK_OK(fsdp_sgd_step(NULL, hi, lo, g, FSDP_FP32, m[1], N, t, 0.01f, 0.9f, 1e-4f, 0.5f));
  }
  for (int i = 0; i < N; i++) {
    float joined = fsdp_bf16_join(hi[i], lo[i]);
    bad += memcmp(&joined, &p[i], 4) != 0 || hi[i] != pb[i];
  }
  CHECK(bad == 0);
  float x = 1;
  CHECK_FAILS(fsdp_adamw_step(p, hi, lo, g, FSDP_FP32, m[0], v[0], 1, 1, &cfg, 1), FSDP_EINVAL, "no fp32 array");
  CHECK_FAILS(fsdp_sgd_step(NULL, NULL, lo, g, FSDP_FP32, &x, 1, 1, 0.1f, 0, 0, 1), FSDP_EINVAL, "no fp32 array");
  free(p), free(g), free(pb), free(hi), free(lo);
  for (int k = 0; k < 2; k++) free(m[k]), free(v[k]);
}

/* bf16 grads (a unit's compact grads) give the fp32 grads' results bit for
 * bit when they hold the same values: AdamW over threads (chunks widened in
 * pieces), SGD, and the sum of squares with its non-finite count */
static void test_bf16_grads(void) {
  enum { BIG = 1000003 };
  fsdp_adamw_config cfg = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  float *g = malloc(BIG * 4), *p[2], *m[2], *v[2];
  uint16_t *g16 = malloc(BIG * 2), *pb[2];
  for (int k = 0; k < 2; k++) {
    p[k] = malloc(BIG * 4), m[k] = calloc(BIG, 4), v[k] = calloc(BIG, 4), pb[k] = malloc(BIG * 2);
    for (int i = 0; i < BIG; i++) p[k][i] = 0.01f * (float)cos(i);
  }
  int threads = fsdp_cpu_threads();
  CHECK_OK(fsdp_cpu_threads_set(4));
  for (int t = 1; t <= 3; t++) {
    for (int i = 0; i < BIG; i++) g16[i] = fsdp_f32_to_bf16(grad_at(t, i)), g[i] = fsdp_bf16_to_f32(g16[i]);
    CHECK_OK(fsdp_adamw_step(p[0], pb[0], NULL, g, FSDP_FP32, m[0], v[0], BIG, t, &cfg, 0.5f));
    CHECK_OK(fsdp_adamw_step(p[1], pb[1], NULL, g16, FSDP_BF16, m[1], v[1], BIG, t, &cfg, 0.5f));
    CHECK_OK(fsdp_sgd_step(p[0], NULL, NULL, g, FSDP_FP32, m[0], N, t, 0.01f, 0.9f, 1e-4f, 0.5f));
    CHECK_OK(fsdp_sgd_step(p[1], NULL, NULL, g16, FSDP_BF16, m[1], N, t, 0.01f, 0.9f, 1e-4f, 0.5f));
  }
  CHECK(!memcmp(p[0], p[1], BIG * 4) && !memcmp(m[0], m[1], BIG * 4) && !memcmp(v[0], v[1], BIG * 4) &&
        !memcmp(pb[0], pb[1], BIG * 2));
  g16[5] = fsdp_f32_to_bf16(NAN), g16[BIG - 2] = fsdp_f32_to_bf16(-INFINITY);
  for (int i = 0; i < BIG; i++) g[i] = fsdp_bf16_to_f32(g16[i]);
  double sum[2];
  int64_t bad[2];
  CHECK_OK(fsdp_sum_squares(g, FSDP_FP32, BIG, &sum[0], &bad[0]));
  CHECK_OK(fsdp_sum_squares(g16, FSDP_BF16, BIG, &sum[1], &bad[1]));
  CHECK(!memcmp(&sum[0], &sum[1], sizeof(double)) && bad[0] == 2 && bad[1] == 2);
  CHECK_FAILS(fsdp_adamw_step(p[0], NULL, NULL, g, 7, m[0], v[0], 1, 1, &cfg, 1), FSDP_EINVAL, "grad dtype 7");
  CHECK_FAILS(fsdp_sum_squares(g, 7, 1, &sum[0], &bad[0]), FSDP_EINVAL, "expected fp32 or bf16");
  fsdp_cpu_threads_set(threads);
  for (int k = 0; k < 2; k++) free(p[k]), free(m[k]), free(v[k]), free(pb[k]);
  free(g), free(g16);
}

int main(void) {
  test_bf16_grads();
  test_split_bits();
  test_split_steps();
  test_adamw_threads();
  test_adamw(0.0f, 1.0f);
  test_adamw(0.1f, 0.25f);
  test_sgd();
  fsdp_adamw_config cfg = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0};
  float x = 1, y = 1;
  CHECK_FAILS(fsdp_adamw_step(&x, NULL, NULL, &y, FSDP_FP32, &x, &y, 1, 0, &cfg, 1), FSDP_EINVAL, "the first real step is 1");
  cfg.beta2 = 1.0f;
  CHECK_FAILS(fsdp_adamw_step(&x, NULL, NULL, &y, FSDP_FP32, &x, &y, 1, 1, &cfg, 1), FSDP_EINVAL, "beta2 < 1");
  float s[5] = {1, 2, NAN, 3, INFINITY};
  double sum = 0;
  int64_t nonfinite = 0;
  CHECK_OK(fsdp_sum_squares(s, FSDP_FP32, 5, &sum, &nonfinite));
  CHECK(sum == 14.0 && nonfinite == 2);
  /* many blocks: against a long double sum (1e-12 relative), the non-finite
   * count, and the same bits on 1 thread as on several */
  {
    int64_t n = 3000017;
    float *g = malloc(sizeof(float) * (size_t)n);
    uint32_t r = 7;
    long double ref = 0;
    for (int64_t i = 0; i < n; i++) {
      r = r * 1664525u + 1013904223u;
      g[i] = (float)((int32_t)r) * 1e-9f;
    }
    g[100] = NAN, g[2999999] = -INFINITY, g[n - 1] = INFINITY;
    for (int64_t i = 0; i < n; i++)
      if (isfinite(g[i])) ref += (long double)g[i] * g[i];
    int threads = fsdp_cpu_threads();
    double one, many;
    int64_t bad1, badn;
    fsdp_cpu_threads_set(1);
    CHECK_OK(fsdp_sum_squares(g, FSDP_FP32, n, &one, &bad1));
    fsdp_cpu_threads_set(threads > 1 ? threads : 3);
    CHECK_OK(fsdp_sum_squares(g, FSDP_FP32, n, &many, &badn));
    fsdp_cpu_threads_set(threads);
    CHECK(bad1 == 3 && badn == 3);
    CHECK(fabsl((long double)one - ref) <= 1e-12L * ref);
    CHECK(memcmp(&one, &many, sizeof one) == 0);
    free(g);
  }
  return fsdp_test_summary("test_optim");
}
