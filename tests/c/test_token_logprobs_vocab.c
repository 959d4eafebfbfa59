/* test_token_logprobs_vocab: the vocab-parallel log-probabilities' passes
 * (fsdp_cross_entropy_vocab_stats, then sums and finish) over 1-4 column
 * slices (uneven, the collectives done here: the max over slices, the
 * target logit, the sums and the xsums added) against the whole row's op
 * (fsdp_token_logprobs, itself held to float64 by test_token_logprobs):
 * - logp and entropy within 1e-5 relative + 1e-6, every dlogit within 1e-6
 *   relative + 1e-9 (fp32 sums in another order), every slice the same
 *   logp and entropy;
 * - ignored rows get 0 in all three; dlogits written over the logits give
 *   the same bits, and without dlogits the same logp and entropy bits; 1
 *   and 3 threads the same bits;
 * - vocab 37 and 32003, with a row of logits 1e4 + [-4, 4) (e^x would
 *   overflow without the max) and a row with logits of -inf (finite, their
 *   dlogits 0);
 * - refused: a bad target (naming its row), bad columns, entropy without
 *   xsum, dlogits without coef. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ref.h"

enum { N = 9, IGN = -100, BIG = 6, NEGINF = 7 };

typedef struct {
  float mx[N], tl[N], sum[N], xsum[N];
} group; /* what the collectives leave on every rank */

static void slice(float *sl, const float *x, int64_t V, int64_t f, int64_t c) {
  for (int i = 0; i < N; i++) memcpy(sl + i * c, x + i * V + f, sizeof(float) * (size_t)c);
}

/* passes 1 and 2 on each slice, with the collectives between */
static void reduce(group *g, float *sl, const float *x, const int32_t *t, int64_t V, const int64_t *firsts, int parts) {
  float pm[N], pt[N], ps[N], pu[N];
  for (int i = 0; i < N; i++) g->mx[i] = -INFINITY, g->tl[i] = 0, g->sum[i] = 0, g->xsum[i] = 0;
  for (int p = 0; p < parts; p++) {
    int64_t f = firsts[p], c = firsts[p + 1] - f;
    slice(sl, x, V, f, c);
    CHECK_OK(fsdp_cross_entropy_vocab_stats(pm, pt, sl, t, N, V, f, c, IGN));
    for (int i = 0; i < N; i++) g->mx[i] = fmaxf(g->mx[i], pm[i]), g->tl[i] += pt[i];
  }
  for (int p = 0; p < parts; p++) {
    int64_t f = firsts[p], c = firsts[p + 1] - f;
    slice(sl, x, V, f, c);
    CHECK_OK(fsdp_token_logprobs_vocab_sums(ps, pu, sl, g->mx, N, c));
    for (int i = 0; i < N; i++) g->sum[i] += ps[i], g->xsum[i] += pu[i];
  }
}

static int near(float got, float want, float rel, float abs_) { return fabsf(got - want) <= rel * fabsf(want) + abs_; }

static void run(int64_t V, unsigned seed) {
  float *x = malloc(sizeof(float) * N * V), *d_ref = malloc(sizeof(float) * N * V), *sl = malloc(sizeof(float) * N * V);
  float *d = malloc(sizeof(float) * N * V), *alias = malloc(sizeof(float) * N * V);
  float wlp[N], wen[N], coef[N];
  int32_t t[N];
  ref_fill(x, NULL, N * V, &seed, 4);
  for (int i = 0; i < N; i++) t[i] = (int32_t)((i * 7919 + 11) % V), coef[i] = 0.3f * (float)(i - 4) + 0.05f;
  t[3] = IGN;
  t[5] = (int32_t)(V - 1);
  for (int64_t j = 0; j < V; j++) x[BIG * V + j] += 1e4f;
  for (int64_t j = 0; j < V; j += 3) x[NEGINF * V + j] = -INFINITY;
  t[NEGINF] = 1;
  CHECK_OK(fsdp_token_logprobs(wlp, wen, d_ref, x, t, coef, N, V, IGN));
  for (int parts = 1; parts <= 4; parts++) {
    int64_t firsts[5];
    for (int p = 0; p <= parts; p++) firsts[p] = p * V / parts + (p > 0 && p < parts ? 1 : 0); /* uneven */
    group g;
    reduce(&g, sl, x, t, V, firsts, parts);
    int bad = 0, same = 1;
    for (int p = 0; p < parts; p++) {
      int64_t f = firsts[p], c = firsts[p + 1] - f;
      float lp[N], en[N], lp2[N], en2[N];
      slice(sl, x, V, f, c);
      CHECK_OK(fsdp_token_logprobs_vocab_finish(lp, en, d, sl, t, coef, g.mx, g.sum, g.xsum, g.tl, N, V, f, c, IGN));
      for (int i = 0; i < N; i++) {
        bad += !near(lp[i], wlp[i], 1e-5f, 1e-6f) || !near(en[i], wen[i], 1e-5f, 1e-6f);
        bad += !isfinite(lp[i]) || !isfinite(en[i]);
        if (t[i] == IGN) bad += lp[i] != 0 || en[i] != 0;
        for (int64_t j = 0; j < c; j++) {
          float r = d_ref[i * V + f + j];
          bad += !near(d[i * c + j], r, 1e-6f, 1e-9f);
          if (t[i] == IGN || (i == NEGINF && (f + j) % 3 == 0)) bad += d[i * c + j] != 0;
        }
      }
      memcpy(alias, sl, sizeof(float) * (size_t)(N * c)); /* written over the logits: the same bits */
      CHECK_OK(fsdp_token_logprobs_vocab_finish(lp2, en2, alias, alias, t, coef, g.mx, g.sum, g.xsum, g.tl, N, V, f, c,
                                                IGN));
      same &= memcmp(alias, d, sizeof(float) * (size_t)(N * c)) == 0;
      CHECK_OK(fsdp_token_logprobs_vocab_finish(lp2, en2, NULL, NULL, t, NULL, g.mx, g.sum, g.xsum, g.tl, N, V, f, c,
                                                IGN)); /* forward only */
      same &= memcmp(lp, lp2, sizeof lp) == 0 && memcmp(en, en2, sizeof en) == 0;
    }
    CHECK(bad == 0);
    CHECK(same);
  }
  /* the same bits for 1 and 3 threads (32003 columns: a row a chunk) */
  int64_t whole[2] = {0, V};
  group g1, g3;
  float lp1[N], lp3[N];
  CHECK_OK(fsdp_cpu_threads_set(1));
  reduce(&g1, sl, x, t, V, whole, 1);
  CHECK_OK(fsdp_token_logprobs_vocab_finish(lp1, NULL, d, x, t, coef, g1.mx, g1.sum, g1.xsum, g1.tl, N, V, 0, V, IGN));
  CHECK_OK(fsdp_cpu_threads_set(3));
  reduce(&g3, sl, x, t, V, whole, 1);
  CHECK_OK(fsdp_token_logprobs_vocab_finish(lp3, NULL, alias, x, t, coef, g3.mx, g3.sum, g3.xsum, g3.tl, N, V, 0, V,
                                            IGN));
  CHECK(memcmp(&g1, &g3, sizeof g1) == 0 && memcmp(lp1, lp3, sizeof lp1) == 0);
  CHECK(memcmp(d, alias, sizeof(float) * (size_t)(N * V)) == 0);
  free(x), free(d_ref), free(sl), free(d), free(alias);
}

static void refusals(void) {
  float x[2 * 5] = {0}, m[2] = {0}, s[2] = {1, 1}, u[2] = {0}, tl[2] = {0}, lp[2], en[2], d[10], coef[2] = {1, 1};
  int32_t t[2] = {1, 9};
  CHECK_FAILS(fsdp_token_logprobs_vocab_finish(lp, en, d, x, t, coef, m, s, u, tl, 2, 8, 3, 5, IGN), FSDP_EINVAL,
              "target 9 in row 1");
  t[1] = 2;
  CHECK_FAILS(fsdp_token_logprobs_vocab_finish(lp, en, d, x, t, coef, m, s, u, tl, 2, 8, 4, 5, IGN), FSDP_EINVAL,
              "columns [4, 9)");
  CHECK_FAILS(fsdp_token_logprobs_vocab_finish(lp, en, NULL, x, t, NULL, m, s, NULL, tl, 2, 8, 3, 5, IGN), FSDP_EINVAL,
              "entropy without xsum");
  CHECK_FAILS(fsdp_token_logprobs_vocab_finish(lp, NULL, d, x, t, NULL, m, s, NULL, tl, 2, 8, 3, 5, IGN), FSDP_EINVAL,
              "dlogits without coef");
  CHECK_FAILS(fsdp_token_logprobs_vocab_sums(s, u, x, NULL, 2, 5), FSDP_EINVAL, "token_logprobs_vocab_sums: bad arguments");
  CHECK_OK(fsdp_token_logprobs_vocab_finish(lp, NULL, NULL, NULL, t, NULL, m, s, NULL, tl, 2, 8, 3, 5, IGN));
}

int main(void) {
  run(37, 3);
  run(32003, 4);
  refusals();
  return fsdp_test_summary("test_token_logprobs_vocab");
}
