/* test_token_logprobs: per-token log-probabilities, entropies and the
 * gradient of a loss over them, against float64:
 * - vocab 37 and 32003: logp within 1e-6 relative + 1e-6 absolute, the
 *   entropy within 1e-5 relative + 1e-6, dlogits = coef (onehot - softmax)
 *   within 1e-5 relative + 1e-7 (32003: 2e-5 + 1e-12); the float64
 *   gradient itself against central differences of sum coef * logp
 *   (h = 1e-5, 1e-6 relative);
 * - ignored rows: 0 in logp, entropy and dlogits; in place (dlogits over
 *   the logits) the same bits; logits of 1e4 do not overflow; a row of
 *   logits 1e4 + [-4, 4) (no digits lost to the log-sum-exp) and one with
 *   logits of -inf (finite: no 0 x -inf = NaN, their dlogits exactly 0):
 *   logp and entropy within 1e-5 relative + 1e-6 of float64, dlogits
 *   within 1e-5 relative + 1e-7; a bad target is refused naming its row,
 *   dlogits without coef too;
 * - 3 threads, and 97 rows give the same bits with 1, 2, 3 and 7. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ref.h"

enum { IGN = -100 };

/* float64 logp, entropy and d(coef * logp)/dx of one row */
static void row_ref(const double *x, int v, int t, double coef, double *logp, double *ent, double *grad) {
  double m = x[0], s = 0, sx = 0;
  for (int j = 1; j < v; j++) m = x[j] > m ? x[j] : m;
  for (int j = 0; j < v; j++) s += exp(x[j] - m), sx += x[j] > -INFINITY ? exp(x[j] - m) * x[j] : 0;
  double lse = m + log(s);
  *logp = x[t] - lse;
  *ent = lse - sx / s;
  if (grad)
    for (int j = 0; j < v; j++) grad[j] = coef * ((j == t) - exp(x[j] - lse));
}

typedef struct {
  double *x;
  int v, t;
} fd_ctx;
static double fd_logp(void *arg) {
  fd_ctx *c = arg;
  double lp, e;
  row_ref(c->x, c->v, c->t, 0, &lp, &e, NULL);
  return lp;
}

static void run(int n, int v, double grel, double gabs, unsigned seed, int central) {
  float *x = malloc(sizeof(float) * (size_t)n * v), *d = malloc(sizeof(float) * (size_t)n * v);
  double *xd = malloc(sizeof(double) * (size_t)n * v), *want = malloc(sizeof(double) * (size_t)n * v);
  float *lp = malloc(sizeof(float) * (size_t)n), *en = malloc(sizeof(float) * (size_t)n), *coef = malloc(sizeof(float) * (size_t)n);
  double *wlp = malloc(sizeof(double) * (size_t)n), *wen = malloc(sizeof(double) * (size_t)n);
  int32_t *t = malloc(sizeof(int32_t) * (size_t)n);
  ref_fill(x, xd, (int64_t)n * v, &seed, 4);
  for (int i = 0; i < n; i++) {
    t[i] = (i % 5 == 4) ? IGN : (int32_t)((i * 7 + 3) % v);
    coef[i] = (float)((i % 3) - 1) * 0.75f + 0.1f * (float)i / (float)n;
  }
  int fd_bad = 0;
  for (int i = 0; i < n; i++) {
    if (t[i] == IGN) {
      wlp[i] = wen[i] = 0;
      for (int j = 0; j < v; j++) want[(size_t)i * v + j] = 0;
      continue;
    }
    row_ref(xd + (size_t)i * v, v, t[i], coef[i], &wlp[i], &wen[i], want + (size_t)i * v);
    if (central && i < 3) { /* the float64 gradient against central differences of coef * logp */
      fd_ctx c = {xd + (size_t)i * v, v, t[i]};
      for (int j = 0; j < v; j++) {
        double g = coef[i] * ref_central(fd_logp, &c, &xd[(size_t)i * v + j], 1e-5), w = want[(size_t)i * v + j];
        if (fabs(g - w) > 1e-6 * fabs(w) + 1e-9) fd_bad++;
      }
    }
  }
  CHECK(fd_bad == 0);
  for (int64_t i = 0; i < (int64_t)n * v; i++) d[i] = NAN;
  CHECK_OK(fsdp_token_logprobs(lp, en, d, x, t, coef, n, v, IGN));
  CHECK(ref_mismatches("logp", lp, wlp, n, 1e-6, 1e-6) == 0);
  CHECK(ref_mismatches("entropy", en, wen, n, 1e-5, 1e-6) == 0);
  CHECK(ref_mismatches("dlogits", d, want, (int64_t)n * v, grel, gabs) == 0);
  /* forward only: the same logp and entropy bits; in place: the same dlogits bits */
  float *lp2 = malloc(sizeof(float) * (size_t)n), *en2 = malloc(sizeof(float) * (size_t)n);
  CHECK_OK(fsdp_token_logprobs(lp2, en2, NULL, x, t, NULL, n, v, IGN));
  CHECK(memcmp(lp, lp2, sizeof(float) * (size_t)n) == 0 && memcmp(en, en2, sizeof(float) * (size_t)n) == 0);
  CHECK_OK(fsdp_token_logprobs(NULL, NULL, x, x, t, coef, n, v, IGN));
  CHECK(memcmp(x, d, sizeof(float) * (size_t)n * v) == 0);
  free(x), free(d), free(xd), free(want), free(lp), free(en), free(coef), free(wlp), free(wen), free(t), free(lp2), free(en2);
}

static void edges(void) {
  float x[2 * 5] = {1e4f, 0, -1e4f, 3, 2, 0, 0, 0, 0, 0}, lp[2], en[2], d[10], coef[2] = {1, -2};
  int32_t t[2] = {0, 3};
  CHECK_OK(fsdp_token_logprobs(lp, en, d, x, t, coef, 2, 5, IGN));
  CHECK(isfinite(lp[0]) && fabsf(lp[0]) < 1e-6f && fabsf(en[0]) < 1e-6f); /* one logit far above: p = 1 */
  CHECK(fabsf(lp[1] - logf(0.2f)) < 1e-6f && fabsf(en[1] - logf(5.0f)) < 1e-6f); /* uniform */
  CHECK(fabsf(d[5 + 3] - (-2.0f * 0.8f)) < 1e-6f && fabsf(d[5] - 0.4f) < 1e-6f);
  /* row 0: large logits close together; row 1: two logits of -inf */
  float y[2 * 5] = {1e4f + 1.5f, 1e4f - 2.25f, 1e4f, 1e4f + 3.0f, 1e4f - 0.5f, -INFINITY, 1.0f, -INFINITY, 0.5f, 2.0f};
  double yd[10], wlp[2], wen[2], wd[10];
  int32_t ty[2] = {2, 1};
  for (int k = 0; k < 10; k++) yd[k] = y[k];
  for (int r = 0; r < 2; r++) row_ref(yd + 5 * r, 5, ty[r], coef[r], &wlp[r], &wen[r], wd + 5 * r);
  CHECK_OK(fsdp_token_logprobs(lp, en, d, y, ty, coef, 2, 5, IGN));
  CHECK(isfinite(en[1]) && isfinite(lp[1]) && d[5] == 0 && d[7] == 0);
  CHECK(ref_mismatches("logp (1e4, -inf)", lp, wlp, 2, 1e-5, 1e-6) == 0);
  CHECK(ref_mismatches("entropy (1e4, -inf)", en, wen, 2, 1e-5, 1e-6) == 0);
  CHECK(ref_mismatches("dlogits (1e4, -inf)", d, wd, 10, 1e-5, 1e-7) == 0);
  t[1] = 5;
  CHECK_FAILS(fsdp_token_logprobs(lp, en, NULL, x, t, NULL, 2, 5, IGN), FSDP_EINVAL, "target 5 in row 1");
  t[1] = 3;
  CHECK_FAILS(fsdp_token_logprobs(lp, en, d, x, t, NULL, 2, 5, IGN), FSDP_EINVAL, "dlogits without coef");
}

/* the same bits for any thread count */
static void threads(void) {
  enum { R = 97, Vt = 300 };
  static float x[R * Vt], lp[4][R], d[4][R * Vt], coef[R];
  static double xd[R * Vt];
  int32_t t[R];
  unsigned seed = 5;
  ref_fill(x, xd, R * Vt, &seed, 3);
  for (int i = 0; i < R; i++) t[i] = i % 9 == 0 ? IGN : (i * 13) % Vt, coef[i] = 0.01f * (float)i - 0.3f;
  const int counts[4] = {1, 2, 3, 7};
  for (int c = 0; c < 4; c++) {
    CHECK_OK(fsdp_cpu_threads_set(counts[c]));
    CHECK_OK(fsdp_token_logprobs(lp[c], NULL, d[c], x, t, coef, R, Vt, IGN));
  }
  for (int c = 1; c < 4; c++)
    CHECK(memcmp(lp[0], lp[c], sizeof lp[0]) == 0 && memcmp(d[0], d[c], sizeof d[0]) == 0);
}

int main(void) {
  threads();
  CHECK_OK(fsdp_cpu_threads_set(3));
  run(13, 37, 1e-5, 1e-7, 11, 1);
  run(9, 32003, 2e-5, 1e-12, 12, 0);
  edges();
  return fsdp_test_summary("token_logprobs");
}
