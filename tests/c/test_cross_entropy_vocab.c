/* test_cross_entropy_vocab: the vocab-parallel cross-entropy's three
 * passes over 1-4 column slices (uneven, the collectives done here: the
 * max over slices, the sums added) against the whole row's op
 * (fsdp_cross_entropy, itself held to float64 by test_cross_entropy): the
 * loss sum within 1e-6 relative, every dlogit within 1e-6 relative + 1e-9
 * (fp32 sums in another order); ignored rows count for nothing and get
 * zero gradients; the count is the same; dlogits written over the logits
 * give the same bits; vocab 37 and 32003; a bad target names its row. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ref.h"

enum { N = 9, IGN = -100 };

static void run(int64_t V, unsigned seed) {
  float *x = malloc(sizeof(float) * N * V), *d_ref = malloc(sizeof(float) * N * V);
  float *d = malloc(sizeof(float) * N * V), *alias = malloc(sizeof(float) * N * V);
  int32_t t[N];
  ref_fill(x, NULL, N * V, &seed, 4);
  for (int i = 0; i < N; i++) t[i] = (int32_t)((i * 7919 + 11) % V);
  t[3] = IGN;
  t[5] = (int32_t)(V - 1);
  double want;
  int64_t want_n;
  CHECK_OK(fsdp_cross_entropy(&want, &want_n, d_ref, x, t, N, V, IGN, 0.25f));
  for (int parts = 1; parts <= 4; parts++) {
    float mx[N], tl[N], sum[N], pm[N], pt[N], ps[N];
    for (int i = 0; i < N; i++) mx[i] = -INFINITY, tl[i] = 0, sum[i] = 0;
    float *sl = malloc(sizeof(float) * N * V);
    int64_t firsts[5];
    for (int p = 0; p <= parts; p++) firsts[p] = p * V / parts + (p > 0 && p < parts ? 1 : 0); /* uneven */
    for (int p = 0; p < parts; p++) { /* pass 1 on each slice, then the max and the sum over slices */
      int64_t f = firsts[p], c = firsts[p + 1] - f;
      for (int i = 0; i < N; i++) memcpy(sl + i * c, x + i * V + f, sizeof(float) * (size_t)c);
      CHECK_OK(fsdp_cross_entropy_vocab_stats(pm, pt, sl, t, N, V, f, c, IGN));
      for (int i = 0; i < N; i++) mx[i] = fmaxf(mx[i], pm[i]), tl[i] += pt[i];
    }
    for (int p = 0; p < parts; p++) {
      int64_t f = firsts[p], c = firsts[p + 1] - f;
      for (int i = 0; i < N; i++) memcpy(sl + i * c, x + i * V + f, sizeof(float) * (size_t)c);
      CHECK_OK(fsdp_cross_entropy_vocab_sum(ps, sl, mx, N, c));
      for (int i = 0; i < N; i++) sum[i] += ps[i];
    }
    int bad = 0, same = 1;
    for (int p = 0; p < parts; p++) {
      int64_t f = firsts[p], c = firsts[p + 1] - f, cnt;
      double loss;
      for (int i = 0; i < N; i++) memcpy(sl + i * c, x + i * V + f, sizeof(float) * (size_t)c);
      CHECK_OK(fsdp_cross_entropy_vocab_finish(&loss, &cnt, d, sl, t, mx, sum, tl, N, V, f, c, IGN, 0.25f));
      CHECK(fabs(loss - want) <= 1e-6 * fabs(want));
      CHECK(cnt == want_n);
      for (int i = 0; i < N; i++)
        for (int64_t j = 0; j < c; j++) {
          float r = d_ref[i * V + f + j];
          bad += !(fabsf(d[i * c + j] - r) <= 1e-6f * fabsf(r) + 1e-9f);
          if (t[i] == IGN) bad += d[i * c + j] != 0;
        }
      memcpy(alias, sl, sizeof(float) * (size_t)(N * c)); /* written over the logits: the same bits */
      CHECK_OK(fsdp_cross_entropy_vocab_finish(&loss, &cnt, alias, alias, t, mx, sum, tl, N, V, f, c, IGN, 0.25f));
      same &= memcmp(alias, d, sizeof(float) * (size_t)(N * c)) == 0;
    }
    CHECK(bad == 0);
    CHECK(same);
    free(sl);
  }
  free(x), free(d_ref), free(d), free(alias);
}

int main(void) {
  run(37, 3);
  run(32003, 4);
  float x[2 * 5] = {0}, m[2], tl[2];
  int32_t t[2] = {1, 9};
  CHECK_FAILS(fsdp_cross_entropy_vocab_stats(m, tl, x, t, 2, 8, 3, 5, IGN), FSDP_EINVAL, "target 9 in row 1");
  CHECK_FAILS(fsdp_cross_entropy_vocab_stats(m, tl, x, t, 2, 8, 4, 5, IGN), FSDP_EINVAL, "columns [4, 9)");
  return fsdp_test_summary("test_cross_entropy_vocab");
}
