/* test_cross_entropy: fused softmax cross-entropy (fp32 with fp32 sums)
 * against float64:
 * - vocab 37: the loss sum within 1e-6 relative, dlogits within 1e-5
 *   relative + 1e-7 of the float64 derivative (itself checked against
 *   central differences, h = 1e-5, 1e-6 relative); ignored rows count for
 *   nothing and get zero grads; writing dlogits over the logits gives the
 *   same bits; logits of 1e4 do not overflow; a bad target is an error
 *   naming its row;
 * - vocab 32003 (Llama 2's 32000 and a partial block of the vector loops):
 *   the loss sum within 1e-6 relative, dlogits within 2e-5 relative + 1e-12
 *   (fp32 sums of 32003 terms);
 * - the exponential over its whole range: rows [0, a] for a from -86.9 to
 *   0, the gradient e^a / (1 + e^a) within 1e-6 relative (measured: 6e-7,
 *   the fp32 rounding of a - lse; the exponential alone is closer), the
 *   target's 1 / (1 + e^a) - 1 within 1.5e-7 absolute (it cancels); below
 *   -87 (e^a < 1.7e-38) within 1e-37 absolute; a NaN logit makes the loss
 *   NaN;
 * - rows shared among CPU threads: every check above runs with 3 threads,
 *   and 97 rows (some ignored) give the same bits with 1, 2, 3 and 7. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ref.h"

enum { N = 13, V = 37, IGN = -100 };

static double row_loss(const double *x, int v, int t) {
  double m = x[0], s = 0;
  for (int j = 1; j < v; j++) m = x[j] > m ? x[j] : m;
  for (int j = 0; j < v; j++) s += exp(x[j] - m);
  return m + log(s) - x[t];
}

/* float64 dlogits of one row into want */
static void row_grad(double *want, const double *x, int v, int t, double scale) {
  double m = x[0], s = 0;
  for (int j = 1; j < v; j++) m = x[j] > m ? x[j] : m;
  for (int j = 0; j < v; j++) s += exp(x[j] - m);
  for (int j = 0; j < v; j++) want[j] = scale * (exp(x[j] - m) / s - (j == t));
}

static void small_vocab(void) {
  unsigned seed = 11;
  static float x[N * V], d[N * V], x2[N * V];
  static double xd[N * V], want[N * V];
  int32_t t[N];
  ref_fill(x, xd, N * V, &seed, 4);
  for (int i = 0; i < N; i++) t[i] = (i % 4 == 3) ? IGN : (int32_t)((i * 5) % V);
  double sum = 0, wsum = 0;
  int64_t cnt = 0, wcnt = 0;
  const float scale = 0.1f;
  for (int i = 0; i < N * V; i++) d[i] = NAN;
  CHECK_OK(fsdp_cross_entropy(&sum, &cnt, d, x, t, N, V, IGN, scale));
  int fd_bad = 0;
  for (int i = 0; i < N; i++) {
    double *row = xd + i * V;
    if (t[i] == IGN) {
      for (int j = 0; j < V; j++) want[i * V + j] = 0;
      continue;
    }
    wsum += row_loss(row, V, t[i]);
    wcnt++;
    row_grad(want + i * V, row, V, t[i], scale);
    for (int j = 0; j < V; j++) {
      double keep = row[j], h = 1e-5;
      row[j] = keep + h;
      double lp = row_loss(row, V, t[i]);
      row[j] = keep - h;
      double lm = row_loss(row, V, t[i]);
      row[j] = keep;
      fd_bad += fabs(scale * (lp - lm) / (2 * h) - want[i * V + j]) > 1e-6 * fabs(want[i * V + j]) + 1e-9;
    }
  }
  CHECK(fd_bad == 0);
  CHECK(cnt == wcnt && fabs(sum - wsum) <= 1e-6 * fabs(wsum));
  CHECK(ref_mismatches("dlogits", d, want, N * V, 1e-5, 1e-7) == 0);
  /* in place over the logits: the same bits */
  memcpy(x2, x, sizeof x);
  double sum2;
  int64_t cnt2;
  CHECK_OK(fsdp_cross_entropy(&sum2, &cnt2, x2, x2, t, N, V, IGN, scale));
  CHECK(sum2 == sum && cnt2 == cnt && memcmp(x2, d, sizeof d) == 0);
  /* huge logits: finite */
  for (int i = 0; i < N * V; i++) x2[i] = (i % 3) ? 1e4f : -1e4f;
  CHECK_OK(fsdp_cross_entropy(&sum2, &cnt2, x2, x2, t, N, V, IGN, 1));
  int finite = isfinite(sum2);
  for (int i = 0; i < N * V; i++) finite &= isfinite(x2[i]);
  CHECK(finite);
  t[2] = V;
  CHECK_FAILS(fsdp_cross_entropy(&sum, &cnt, d, x, t, N, V, IGN, 1), FSDP_EINVAL, "target 37 in row 2");
}

/* a vocabulary of Llama 2's size: fp32 sums over 32003 terms */
static void large_vocab(void) {
  enum { R = 4, BIG = 32003 };
  unsigned seed = 5;
  float *x = malloc(sizeof(float) * R * BIG), *d = ref_poisoned(R * BIG);
  double *xd = malloc(sizeof(double) * R * BIG), *want = malloc(sizeof(double) * R * BIG);
  ref_fill(x, xd, R * BIG, &seed, 6);
  int32_t t[R] = {0, BIG - 1, 12345, BIG / 2};
  double sum, wsum = 0;
  int64_t cnt;
  CHECK_OK(fsdp_cross_entropy(&sum, &cnt, d, x, t, R, BIG, IGN, 0.5f));
  for (int i = 0; i < R; i++) {
    wsum += row_loss(xd + (int64_t)i * BIG, BIG, t[i]);
    row_grad(want + (int64_t)i * BIG, xd + (int64_t)i * BIG, BIG, t[i], 0.5);
  }
  CHECK(cnt == R && fabs(sum - wsum) <= 1e-6 * fabs(wsum));
  CHECK(ref_mismatches("dlogits, vocab 32003", d, want, (int64_t)R * BIG, 2e-5, 1e-12) == 0);
  free(x), free(d), free(xd), free(want);
}

/* rows [0, a]: d[1] = e^a / (1 + e^a), so the exponential is seen alone
 * over its range, n = -126 .. 0 */
static void exp_range(void) {
  enum { R = 1000 };
  static float x[R * 2], d[R * 2];
  static double want[R * 2];
  int32_t t[R];
  for (int i = 0; i < R; i++) {
    double a = i < R - 4 ? -86.9 * i / (R - 5) : (double[]){-87.5, -100, -1e4, -INFINITY}[i - (R - 4)];
    x[2 * i] = 0, x[2 * i + 1] = (float)a, t[i] = 0;
    double xd[2] = {0, x[2 * i + 1]};
    row_grad(want + 2 * i, xd, 2, 0, 1);
  }
  double sum;
  int64_t cnt;
  CHECK_OK(fsdp_cross_entropy(&sum, &cnt, d, x, t, R, 2, IGN, 1));
  /* d[1] alone: d[0] = softmax - 1 cancels (1e-7 absolute) */
  static float got1[R];
  static double want1[R];
  for (int i = 0; i < R; i++) got1[i] = d[2 * i + 1], want1[i] = want[2 * i + 1];
  CHECK(ref_mismatches("e^a, a in [-86.9, 0]", got1, want1, R - 4, 1e-6, 0) == 0);
  CHECK(ref_mismatches("e^a, a < -87", got1 + R - 4, want1 + R - 4, 4, 0, 1e-37) == 0);
  CHECK(ref_mismatches("softmax - 1", d, want, 2 * R, 0, 1.5e-7) == 0);
  x[2 * 7 + 1] = NAN;
  CHECK_OK(fsdp_cross_entropy(&sum, &cnt, d, x, t, R, 2, IGN, 1));
  CHECK(isnan(sum));
}

static void same_bits_any_threads(void) {
  enum { R = 97, VB = 3001 };
  unsigned seed = 11;
  float *x = malloc(sizeof(float) * R * VB), *d1 = ref_poisoned(R * VB), *d = ref_poisoned(R * VB);
  ref_fill(x, NULL, R * VB, &seed, 4);
  int32_t t[R];
  for (int i = 0; i < R; i++) t[i] = i % 10 == 3 ? IGN : (i * 7919) % VB;
  double s1, s;
  int64_t c1, c;
  CHECK_OK(fsdp_cpu_threads_set(1));
  CHECK_OK(fsdp_cross_entropy(&s1, &c1, d1, x, t, R, VB, IGN, 0.25f));
  static const int counts[] = {2, 3, 7};
  for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
    CHECK_OK(fsdp_cpu_threads_set(counts[k]));
    CHECK_OK(fsdp_cross_entropy(&s, &c, d, x, t, R, VB, IGN, 0.25f));
    CHECK(c == c1 && c1 == R - 10 && memcmp(&s, &s1, sizeof s) == 0 && memcmp(d, d1, sizeof(float) * R * VB) == 0);
  }
  free(x), free(d1), free(d);
}

int main(void) {
  same_bits_any_threads();
  CHECK_OK(fsdp_cpu_threads_set(3)); /* the checks below with rows shared among threads */
  small_vocab();
  large_vocab();
  exp_range();
  return fsdp_test_summary("test_cross_entropy");
}
