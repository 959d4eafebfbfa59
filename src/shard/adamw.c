/* adamw.c: AdamW on a flat fp32 shard (Loshchilov & Hutter: decoupled
 * weight decay), with bias correction from a step counter that starts at 1
 * on the first real step (a step 0 is refused: the silent 1.3-2x too-small
 * updates of an off-by-one counter are a known peer bug). Optionally writes
 * the new values rounded to bf16 in the same pass (the compute-dtype copy,
 * ties away from zero: base/bf16_split.h), or keeps the fp32 params split
 * into that copy and their low 16 bits. The grads are fp32, or bf16 where a
 * unit keeps them so (compact grads: the same values, widened exactly).
 *
 *   p <- p - lr * wd * p
 *   m <- b1 m + (1 - b1) g          g = grad * grad_scale
 *   v <- b2 v + (1 - b2) g^2
 *   p <- p - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
 *
 * Large shards are split over the CPU threads (base/parallel.c): with the
 * optimizer offloaded to the host this loop is the step's critical path. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../base/bf16.h"
#include "../base/bf16_split.h"
#include "../base/error.h"
#include "../base/parallel.h"
#include "../base/adamw_math.h"
#include "../fsdp_shard.h"

/* below this many elements a step stays on the calling thread */
enum { GRAIN = 1 << 16 };

typedef struct adamw_job {
  float *param, *m, *v;
  uint16_t *param_bf16, *param_low;
  const float *grad;          /* fp32 grads, or */
  const uint16_t *grad_bf16;  /* bf16 ones (widened a chunk at a time) */
  float grad_scale, b1, b2, lr, eps, decay, c1, c2;
} adamw_job;

/* Two loops without control flow inside, so that the compiler vectorises
 * each (CMakeLists.txt builds this file with -O3 -fno-math-errno: sqrtf
 * becomes the vector square root; no reassociation, so the results are the
 * plain loop's bit for bit). */
/* x86-64 with GCC: an AVX2 copy too, picked at load time where the CPU has it */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FSDP_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FSDP_VECTOR_CLONES
#endif

#if defined(__GNUC__)
#define FSDP_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define FSDP_ALWAYS_INLINE inline
#endif

/* n elements from lo, grad[k] being element lo + k's (every array indexed
 * from 0 here, the form the vectoriser handles best) */
static FSDP_ALWAYS_INLINE void adamw_loops(const adamw_job *j, const float *restrict grad, int64_t lo, int64_t n) {
  float *restrict param = j->param ? j->param + lo : NULL, *restrict m = j->m + lo, *restrict v = j->v + lo;
  uint16_t *restrict out = j->param_bf16 ? j->param_bf16 + lo : NULL;
  uint16_t *restrict low = j->param_low ? j->param_low + lo : NULL;
  const float gs = j->grad_scale, b1 = j->b1, b2 = j->b2, lr = j->lr, eps = j->eps, decay = j->decay, c1 = j->c1,
              c2 = j->c2;
  if (low) { /* split: the fp32 param is joined, updated and split again */
    for (int64_t k = 0; k < n; k++) {
      float p = fsdp_bf16_join(out[k], low[k]);
      fsdp_adamw_element(&p, m + k, v + k, grad[k] * gs, b1, b2, lr, eps, decay, c1, c2);
      out[k] = fsdp_bf16_round_away(p);
      low[k] = fsdp_bf16_low(p);
    }
    return;
  }
  if (!out) {
    for (int64_t k = 0; k < n; k++) fsdp_adamw_element(param + k, m + k, v + k, grad[k] * gs, b1, b2, lr, eps, decay, c1, c2);
    return;
  }
  for (int64_t k = 0; k < n; k++)
    out[k] = fsdp_bf16_round_away(fsdp_adamw_element(param + k, m + k, v + k, grad[k] * gs, b1, b2, lr, eps, decay, c1, c2));
}

/* bf16 grads are widened (exactly) into an fp32 chunk that stays in L1 */
enum { GRAD_CHUNK = 1024 };

static FSDP_ALWAYS_INLINE void widen(float *restrict dst, const uint16_t *restrict src, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = fsdp_bf16_load(src[i]);
}

FSDP_VECTOR_CLONES static void adamw_range(void *arg, int64_t lo, int64_t hi) {
  const adamw_job *j = arg;
  if (!j->grad_bf16) {
    adamw_loops(j, j->grad + lo, lo, hi - lo);
    return;
  }
  float g[GRAD_CHUNK];
  for (int64_t c = lo; c < hi; c += GRAD_CHUNK) {
    int64_t e = hi - c < GRAD_CHUNK ? hi : c + GRAD_CHUNK;
    widen(g, j->grad_bf16 + c, e - c);
    adamw_loops(j, g, c, e - c);
  }
}

/* the grads' dtype: fp32, or bf16 where the unit keeps them so */
static int check_grad_dtype(const char *who, int grad_dtype) {
  if (grad_dtype == FSDP_FP32 || grad_dtype == FSDP_BF16) return FSDP_OK;
  return fsdp_fail(FSDP_EINVAL, "%s: grad dtype %d (expected fp32 or bf16)", who, grad_dtype);
}

/* the params an optimizer step reads and writes: fp32 (with an optional bf16
 * copy), or split (high halves in param_bf16, low halves in param_low) */
static int check_params(const char *who, const float *param, const uint16_t *param_bf16, const uint16_t *param_low) {
  if (param_low && (param || !param_bf16))
    return fsdp_fail(FSDP_EINVAL, "%s: split params take the high halves (param_bf16) and the low ones, no fp32 array", who);
  if (!param_low && !param) return fsdp_fail(FSDP_EINVAL, "%s: NULL param buffer", who);
  return FSDP_OK;
}

int fsdp_adamw_step(float *param, uint16_t *param_bf16, uint16_t *param_low, const void *grad, int grad_dtype, float *m,
                    float *v, int64_t n, int64_t step, const fsdp_adamw_config *cfg, float grad_scale) {
  if (!cfg) return fsdp_fail(FSDP_EINVAL, "adamw: NULL config");
  FSDP_CHECK(check_grad_dtype("adamw", grad_dtype));
  if (n < 0) return fsdp_fail(FSDP_EINVAL, "adamw: negative length %lld", (long long)n);
  if (n && (!grad || !m || !v)) return fsdp_fail(FSDP_EINVAL, "adamw: NULL buffer");
  if (n) FSDP_CHECK(check_params("adamw", param, param_bf16, param_low));
  if (step < 1)
    return fsdp_fail(FSDP_EINVAL, "adamw: step %lld; the first real step is 1 (bias correction divides by "
                     "1 - beta^step)", (long long)step);
  if (!(cfg->beta1 >= 0 && cfg->beta1 < 1 && cfg->beta2 >= 0 && cfg->beta2 < 1 && cfg->eps > 0 && cfg->lr >= 0 &&
        cfg->weight_decay >= 0))
    return fsdp_fail(FSDP_EINVAL, "adamw: expected 0 <= beta1, beta2 < 1, eps > 0, lr >= 0, weight_decay >= 0 "
                     "(got %g, %g, %g, %g, %g)", cfg->beta1, cfg->beta2, cfg->eps, cfg->lr, cfg->weight_decay);
  /* the corrections in double: 1 - 0.999^t loses digits in float for small t */
  const float c1 = (float)(1.0 / (1.0 - pow(cfg->beta1, (double)step)));
  const float c2 = (float)(1.0 / (1.0 - pow(cfg->beta2, (double)step)));
  int g16 = grad_dtype == FSDP_BF16;
  adamw_job j = {.param = param, .m = m, .v = v, .param_bf16 = param_bf16, .param_low = param_low,
                 .grad = g16 ? NULL : grad, .grad_bf16 = g16 ? grad : NULL, .grad_scale = grad_scale,
                 .b1 = cfg->beta1, .b2 = cfg->beta2, .lr = cfg->lr, .eps = cfg->eps,
                 .decay = 1.0f - cfg->lr * cfg->weight_decay, .c1 = c1, .c2 = c2};
  /* elementwise: the same values on any number of threads */
  fsdp_parallel_for(n, GRAIN, adamw_range, &j);
  return FSDP_OK;
}

/* SGD with momentum (PyTorch's form, coupled weight decay):
 *   g <- grad * grad_scale + wd * p;  buf <- mu * buf + g (buf = g on step 1);  p <- p - lr * buf */
int fsdp_sgd_step(float *param, uint16_t *param_bf16, uint16_t *param_low, const void *grad, int grad_dtype,
                  float *momentum, int64_t n, int64_t step, float lr, float mu, float weight_decay, float grad_scale) {
  FSDP_CHECK(check_grad_dtype("sgd", grad_dtype));
  const float *g32 = grad_dtype == FSDP_FP32 ? grad : NULL;
  const uint16_t *g16 = grad_dtype == FSDP_BF16 ? grad : NULL;
  if (n < 0 || (n && (!grad || (mu != 0 && !momentum)))) return fsdp_fail(FSDP_EINVAL, "sgd: bad buffers");
  if (n) FSDP_CHECK(check_params("sgd", param, param_bf16, param_low));
  if (step < 1) return fsdp_fail(FSDP_EINVAL, "sgd: step %lld; the first real step is 1", (long long)step);
  for (int64_t i = 0; i < n; i++) {
    float p = param_low ? fsdp_bf16_join(param_bf16[i], param_low[i]) : param[i];
    float g = (g32 ? g32[i] : fsdp_bf16_load(g16[i])) * grad_scale + weight_decay * p;
    if (mu != 0) {
      momentum[i] = step == 1 ? g : mu * momentum[i] + g;
      g = momentum[i];
    }
    p -= lr * g;
    if (param_low) param_low[i] = fsdp_bf16_low(p);
    else param[i] = p;
    if (param_bf16) param_bf16[i] = fsdp_bf16_round_away(p);
  }
  return FSDP_OK;
}

/* Sum of squares in double (for the global grad norm: local sum, then one
 * all-reduce), and the count of non-finite elements. The shard is cut into
 * fixed blocks summed on the CPU threads, each with eight running sums (so
 * the loop vectorises without reassociating), then added in block order:
 * the same result for any number of threads. */
enum { SUMSQ_BLOCK = 1 << 16 };

/* x squared in double, or 0 when x is not finite (its bits masked away:
 * integer arithmetic, no branch, so the loop below vectorises) */
static inline double square_if_finite(float x, uint32_t *finite) {
  uint32_t u;
  memcpy(&u, &x, 4);
  *finite = (u & 0x7f800000u) != 0x7f800000u;
  u &= 0u - *finite;
  memcpy(&x, &u, 4);
  return (double)x * x;
}

/* elements into the eight running sums (acc[k] takes elements i + k, the
 * tail acc[0]): a chunk of a multiple of 8 continues them exactly */
static FSDP_ALWAYS_INLINE void sumsq_acc(const float *restrict x, int64_t n, double *restrict acc, int64_t *bad) {
  int64_t nb = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    uint32_t f[8];
    for (int k = 0; k < 8; k++) acc[k] += square_if_finite(x[i + k], &f[k]);
    for (int k = 0; k < 8; k++) nb += 1 - f[k];
  }
  for (; i < n; i++) {
    if (!isfinite(x[i])) {
      nb++;
      continue;
    }
    acc[0] += (double)x[i] * x[i];
  }
  *bad += nb;
}

/* one block, fp32 or bf16 (widened a chunk at a time: the same sums) */
static FSDP_ALWAYS_INLINE void block_sumsq(const float *x, const uint16_t *xb, int64_t n, double *sum, int64_t *bad) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  *bad = 0;
  if (x) {
    sumsq_acc(x, n, acc, bad);
  } else {
    float w[GRAD_CHUNK];
    for (int64_t c = 0; c < n; c += GRAD_CHUNK) {
      int64_t len = n - c < GRAD_CHUNK ? n - c : GRAD_CHUNK;
      widen(w, xb + c, len);
      sumsq_acc(w, len, acc, bad);
    }
  }
  *sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

typedef struct sumsq_job {
  const float *x;
  const uint16_t *xb;
  int64_t n;
  double *part;
  int64_t *bad;
} sumsq_job;

FSDP_VECTOR_CLONES static void sumsq_range(void *arg, int64_t lo, int64_t hi) {
  const sumsq_job *j = arg;
  for (int64_t b = lo; b < hi; b++) {
    int64_t at = b * SUMSQ_BLOCK, len = j->n - at < SUMSQ_BLOCK ? j->n - at : SUMSQ_BLOCK;
    block_sumsq(j->x ? j->x + at : NULL, j->x ? NULL : j->xb + at, len, &j->part[b], &j->bad[b]);
  }
}

int fsdp_sum_squares(const void *x, int dtype, int64_t n, double *sum, int64_t *nonfinite) {
  if (n < 0 || (n && !x) || !sum) return fsdp_fail(FSDP_EINVAL, "sum_squares: bad arguments");
  FSDP_CHECK(check_grad_dtype("sum_squares", dtype));
  int64_t blocks = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK;
  double part1;
  int64_t bad1;
  double *part = blocks > 1 ? malloc(sizeof(double) * (size_t)blocks) : &part1;
  int64_t *bad = blocks > 1 ? malloc(sizeof(int64_t) * (size_t)blocks) : &bad1;
  if (!part || !bad) {
    if (blocks > 1) free(part), free(bad);
    return fsdp_fail(FSDP_ENOMEM, "sum_squares: out of memory");
  }
  sumsq_job j = {dtype == FSDP_FP32 ? x : NULL, dtype == FSDP_BF16 ? x : NULL, n, part, bad};
  if (blocks > 0) fsdp_parallel_for(blocks, 4, sumsq_range, &j);
  double s = 0;
  int64_t nb = 0;
  for (int64_t b = 0; b < blocks; b++) {
    s += part[b];
    nb += bad[b];
  }
  if (blocks > 1) free(part), free(bad);
  *sum = s;
  if (nonfinite) *nonfinite = nb;
  return FSDP_OK;
}
