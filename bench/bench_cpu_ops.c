/* bench_cpu_ops: the CPU ops of a Llama step at the demo's shapes
 * (recipes/tiny.lua: 8 x 128 tokens, hidden 128, 4/2 heads of 32, SwiGLU
 * 352, vocab 256) and at a larger one (512 tokens, hidden 512, 8/4 heads of
 * 64, SwiGLU 1408, vocab 32000; attention at T = 1024 and 2048): each op's forward
 * and backward, timed on this process's BLAS threads (the engine's choice:
 * src/ops/blas_threads.c). Model FLOPs as the trainer counts them
 * (attention: the full T x T products, 4 T^2 D per head forward, 8 backward).
 * Compare libraries by running the same binary with LD_PRELOAD of another
 * libfsdp.so, alternately (bench/RESULTS.md).
 *   bench_cpu_ops [REPEATS (default 20)] [FILTER (a substring of the names)]
 * Prints one line per case: best and median ms of REPEATS, GFLOP/s at the best. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp.h"

typedef struct bcase {
  const char *name;
  int (*fn)(const struct bcase *);
  int64_t a, b, c, d, e; /* the op's shape */
  double flops;
} bcase;

static float *buf(int64_t n) {
  float *p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  if (!p) {
    fprintf(stderr, "bench_cpu_ops: out of memory\n");
    exit(1);
  }
  for (int64_t i = 0; i < n; i++) p[i] = 0.01f * (float)((i * 7919) % 201 - 100);
  return p;
}

/* buffers sized for the largest case, made once */
static float *X, *Y, *W, *DX, *DW, *Q, *K, *V, *O, *L, *DQ, *DK, *DV, *DO;
static int32_t *TG;

/* linear: a = tokens, b = in, c = out; forward then backward (dx, dW) */
static int linear(const bcase *k) {
  int rc = fsdp_linear_forward(Y, X, W, NULL, k->a, k->b, k->c);
  return rc ? rc : fsdp_linear_backward(DX, DW, NULL, Y, X, W, k->a, k->b, k->c);
}
/* attention: a = batch, b = T, c = heads, d = kv heads, e = head dim */
static int attention(const bcase *k) {
  int rc = fsdp_attention_forward(O, L, Q, K, V, k->a, k->b, k->c, k->d, k->e);
  return rc ? rc : fsdp_attention_backward(DQ, DK, DV, DO, Q, K, V, O, L, k->a, k->b, k->c, k->d, k->e);
}
/* its forward alone */
static int attention_forward(const bcase *k) {
  return fsdp_attention_forward(O, L, Q, K, V, k->a, k->b, k->c, k->d, k->e);
}
/* cross-entropy: a = rows, b = vocab, the gradient written over the
 * logits (as the trainer does; the next repeat reads that gradient as its
 * logits: the same work) */
static int cross_entropy(const bcase *k) {
  double sum;
  int64_t cnt;
  return fsdp_cross_entropy(&sum, &cnt, Y, Y, TG, k->a, k->b, -100, 1.0f);
}

/* swiglu: a = elements; forward then backward */
static int swiglu(const bcase *k) {
  int rc = fsdp_swiglu_forward(Y, X, W, k->a);
  return rc ? rc : fsdp_swiglu_backward(DX, DW, Y, X, W, k->a);
}

/* rmsnorm: a = rows, b = width; forward then backward (dw accumulates) */
static int rmsnorm(const bcase *k) {
  int rc = fsdp_rmsnorm_forward(Y, L, X, W, k->a, k->b, 1e-5f);
  return rc ? rc : fsdp_rmsnorm_backward(DX, DW, Y, X, W, L, k->a, k->b);
}

#define LIN(name, n, i, o) {name, linear, n, i, o, 0, 0, 6.0 * (n) * (i) * (o)}
#define ATT(name, b, t, h, hk, d) {name, attention, b, t, h, hk, d, 12.0 * (b) * (h) * (t) * (t) * (d)}
#define ATTF(name, b, t, h, hk, d) {name, attention_forward, b, t, h, hk, d, 4.0 * (b) * (h) * (t) * (t) * (d)}
#define CE(name, n, v) {name, cross_entropy, n, v, 0, 0, 0, 0}
#define SWI(name, n) {name, swiglu, n, 0, 0, 0, 0, 0}
#define NORM(name, n, d) {name, rmsnorm, n, d, 0, 0, 0, 0}

static const bcase cases[] = {
    LIN("tiny linear 1024x128->128", 1024, 128, 128),
    LIN("tiny linear 1024x128->352", 1024, 128, 352),
    LIN("tiny linear 1024x352->128", 1024, 352, 128),
    LIN("tiny linear 1024x128->256 (head)", 1024, 128, 256),
    ATT("tiny attention 8x128, 4/2 heads of 32", 8, 128, 4, 2, 32),
    CE("tiny cross_entropy 1024 rows x 256", 1024, 256),
    SWI("tiny swiglu 1024x352, fwd+bwd", 1024 * 352),
    NORM("tiny rmsnorm 1024x128, fwd+bwd", 1024, 128),
    LIN("large linear 512x512->512", 512, 512, 512),
    LIN("large linear 512x512->1408", 512, 512, 1408),
    LIN("large linear 512x1408->512", 512, 1408, 512),
    LIN("large linear 512x512->32000 (head)", 512, 512, 32000),
    ATT("large attention 1x1024, 8/4 heads of 64", 1, 1024, 8, 4, 64),
    CE("large cross_entropy 512 rows x 32000", 512, 32000),
    ATT("long attention 1x2048, 8/4 heads of 64", 1, 2048, 8, 4, 64),
    ATTF("long attention 1x2048, forward", 1, 2048, 8, 4, 64),
    ATT("grouped attention 1x1024, 16/4 heads of 64", 1, 1024, 16, 4, 64),
    SWI("large swiglu 512x1408, fwd+bwd", 512 * 1408),
    NORM("large rmsnorm 512x512, fwd+bwd", 512, 512),
    NORM("long rmsnorm 2048x512, fwd+bwd", 2048, 512),
};

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 20;
  const char *filter = argc > 2 ? argv[2] : "";
  if (reps < 1) {
    fprintf(stderr, "usage: bench_cpu_ops [REPEATS] [FILTER]\n");
    return 2;
  }
  const int64_t big = 512 * 32000, att = 2048 * 8 * 64;
  X = buf(big), Y = buf(big), W = buf(big), DX = buf(big), DW = buf(big);
  Q = buf(att), K = buf(att), V = buf(att), O = buf(att), L = buf(att), DQ = buf(att), DK = buf(att), DV = buf(att);
  DO = buf(att);
  TG = malloc(sizeof(int32_t) * 1024);
  for (int i = 0; i < 1024; i++) TG[i] = (i * 37) % 256;
  double *t = malloc(sizeof(double) * (size_t)reps);
  printf("# bench_cpu_ops: best and median of %d\n# %-44s %10s %10s %10s\n", reps, "case", "best_ms", "median_ms", "GFLOP/s");
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const bcase *k = &cases[c];
    if (!strstr(k->name, filter)) continue;
    if (k->fn(k) != 0) { /* warm-up, and the check that the case runs */
      fprintf(stderr, "bench_cpu_ops: %s: %s\n", k->name, fsdp_last_error());
      return 1;
    }
    for (int r = 0; r < reps; r++) {
      double t0 = fsdp_time_now();
      k->fn(k);
      t[r] = fsdp_time_now() - t0;
    }
    qsort(t, (size_t)reps, sizeof(double), cmp);
    if (k->flops > 0)
      printf("  %-44s %10.3f %10.3f %10.1f\n", k->name, t[0] * 1e3, t[reps / 2] * 1e3, k->flops / t[0] / 1e9);
    else
      printf("  %-44s %10.3f %10.3f %10s\n", k->name, t[0] * 1e3, t[reps / 2] * 1e3, "-");
  }
  return 0;
}
