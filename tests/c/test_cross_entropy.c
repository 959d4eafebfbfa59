/* test_cross_entropy: fused softmax cross-entropy against float64: the
 * loss sum within 1e-6 relative, dlogits within 1e-5 relative + 1e-7 of
 * the float64 derivative (itself checked against central differences,
 * h = 1e-5, 1e-6 relative); ignored rows count for nothing and get zero
 * grads; writing dlogits over the logits gives the same bits; logits of
 * 1e4 do not overflow; a bad target is an error naming its row. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ref.h"

enum { N = 13, V = 37, IGN = -100 };

static double row_loss(const double *x, int t) {
  double m = x[0], s = 0;
  for (int j = 1; j < V; j++) m = x[j] > m ? x[j] : m;
  for (int j = 0; j < V; j++) s += exp(x[j] - m);
  return m + log(s) - x[t];
}

int main(void) {
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
    wsum += row_loss(row, t[i]);
    wcnt++;
    double m = row[0], s = 0;
    for (int j = 1; j < V; j++) m = row[j] > m ? row[j] : m;
    for (int j = 0; j < V; j++) s += exp(row[j] - m);
    for (int j = 0; j < V; j++) {
      want[i * V + j] = scale * (exp(row[j] - m) / s - (j == t[i]));
      double keep = row[j], h = 1e-5;
      row[j] = keep + h;
      double lp = row_loss(row, t[i]);
      row[j] = keep - h;
      double lm = row_loss(row, t[i]);
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
  return fsdp_test_summary("test_cross_entropy");
}
