/* test_attention_merge: ring attention's combine (context parallelism,
 * issue 46): fsdp_attention_merge merges a partial result (out_b, lse_b:
 * attention over one block of keys) into the accumulator (out, lse) by
 * their log-sum-exps.
 * - Random partials (lse in [-4, 4], and rows 40 and 100 apart, where one
 *   side's weight is tiny or denormal) against float64 on the same floats:
 *   out, lse within 1e-6 relative + 1e-6.
 * - A ring over blocks of keys: a rank's queries (rank 0 of cp = 2: chunks
 *   0 and 3 of 4) against each block of the keys by
 *   fsdp_attention_forward_pos, rows that see none of a block given out 0
 *   and lse -inf, merged block by block into an accumulator that starts at
 *   lse -inf and an unwritten (NaN) out: equals attention over all the keys
 *   at once (the op, and float64) within 1e-5 relative + 1e-6, for the key
 *   range in halves, in its 4 chunks in order and in another ring's order,
 *   and in uneven blocks (one of a single key).
 * - Rows with lse_b = -inf leave the accumulator bit for bit (out_b's row
 *   NaN: not read); rows whose lse is -inf take the partial bit for bit
 *   (their out row NaN: not read); both -inf: out and lse as they were, no
 *   NaN.
 * - The same bits with 1 and 3 CPU threads.
 * - Refusals: bad sizes, NULL buffers (none needed when there are no rows). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ref.h"

/* the merge in float64 from the same floats, by the formula of fsdp_ops.h */
static void ref_merge(double *o, double *l, const float *out, const float *lse, const float *out_b, const float *lse_b,
                      int B, int T, int H, int D) {
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int t = 0; t < T; t++) {
        const int64_t li = ((int64_t)b * H + h) * T + t, oi = (((int64_t)b * T + t) * H + h) * D;
        const double la = lse[li], lb = lse_b[li], m = la > lb ? la : lb;
        const double a = la == -INFINITY ? 0 : exp(la - m), e = lb == -INFINITY ? 0 : exp(lb - m);
        l[li] = m == -INFINITY ? -INFINITY : m + log(a + e);
        for (int d = 0; d < D; d++)
          o[oi + d] = m == -INFINITY ? out[oi + d]
                                     : ((a ? a * out[oi + d] : 0) + (e ? e * out_b[oi + d] : 0)) / (a + e);
      }
}

static void random_partials(int B, int T, int H, int D, unsigned seed) {
  const int64_t no = (int64_t)B * T * H * D, nl = (int64_t)B * H * T;
  float *out = malloc(4 * no), *ob = malloc(4 * no), *lse = malloc(4 * nl), *lb = malloc(4 * nl);
  double *o64 = malloc(8 * no), *l64 = malloc(8 * nl);
  ref_fill(out, NULL, no, &seed, 1.0), ref_fill(ob, NULL, no, &seed, 1.0);
  ref_fill(lse, NULL, nl, &seed, 4.0), ref_fill(lb, NULL, nl, &seed, 4.0);
  for (int64_t i = 0; i < nl; i += 5) lb[i] = lse[i] + 40; /* the accumulator's weight e^-40 */
  for (int64_t i = 3; i < nl; i += 7) lse[i] = lb[i] + 100; /* the partial's weight denormal */
  ref_merge(o64, l64, out, lse, ob, lb, B, T, H, D);
  CHECK_OK(fsdp_attention_merge(out, lse, ob, lb, B, T, H, D));
  CHECK(ref_mismatches("random partials: out", out, o64, no, 1e-6, 1e-6) == 0);
  CHECK(ref_mismatches("random partials: lse", lse, l64, nl, 1e-6, 1e-6) == 0);
  free(out), free(ob), free(lse), free(lb), free(o64), free(l64);
}

/* rows [lo, hi) of each batch row of x [B, T, w] into dst [B, hi - lo, w] */
static void key_rows(float *dst, const float *x, int lo, int hi, int B, int T, int w) {
  for (int b = 0; b < B; b++)
    memcpy(dst + (size_t)b * (hi - lo) * w, x + ((size_t)b * T + lo) * w, sizeof(float) * (size_t)(hi - lo) * w);
}

typedef struct {
  int B, Tq, Tk, H, Hkv, D;
  const int32_t *pos;
  const float *q, *k, *v;
} ring;

/* the partial of keys [lo, hi): query i sees keys lo .. min(pos[i], hi - 1),
 * none where pos[i] < lo (out row 0, lse -inf) */
static void block_partial(const ring *r, int lo, int hi, float *out, float *lse) {
  const int B = r->B, Tq = r->Tq, H = r->H, D = r->D, n = hi - lo, w = r->Hkv * r->D;
  float *kb = malloc(sizeof(float) * (size_t)B * n * w), *vb = malloc(sizeof(float) * (size_t)B * n * w);
  int32_t *bp = malloc(sizeof(int32_t) * (size_t)Tq);
  key_rows(kb, r->k, lo, hi, B, r->Tk, w), key_rows(vb, r->v, lo, hi, B, r->Tk, w);
  for (int i = 0; i < Tq; i++) bp[i] = r->pos[i] < lo ? 0 : (r->pos[i] < hi ? r->pos[i] : hi - 1) - lo;
  CHECK_OK(fsdp_attention_forward_pos(out, lse, r->q, kb, vb, bp, B, Tq, n, H, r->Hkv, D));
  for (int b = 0; b < B; b++)
    for (int i = 0; i < Tq; i++)
      if (r->pos[i] < lo)
        for (int h = 0; h < H; h++) {
          lse[((int64_t)b * H + h) * Tq + i] = -INFINITY;
          memset(out + (((int64_t)b * Tq + i) * H + h) * D, 0, sizeof(float) * (size_t)D);
        }
  free(kb), free(vb), free(bp);
}

/* blocks [edges[order[s]], edges[order[s] + 1]) merged in step order s;
 * against the op over all the keys (want_o, want_l) */
static void run_ring(const ring *r, const int *edges, const int *order, int steps, const double *want_o,
                     const double *want_l, const char *what) {
  const int64_t no = (int64_t)r->B * r->Tq * r->H * r->D, nl = (int64_t)r->B * r->H * r->Tq;
  float *acc_o = ref_poisoned(no), *acc_l = malloc(4 * nl), *po = ref_poisoned(no), *pl = ref_poisoned(nl);
  for (int64_t i = 0; i < nl; i++) acc_l[i] = -INFINITY; /* nothing seen: out not read */
  for (int s = 0; s < steps; s++) {
    block_partial(r, edges[order[s]], edges[order[s] + 1], po, pl);
    CHECK_OK(fsdp_attention_merge(acc_o, acc_l, po, pl, r->B, r->Tq, r->H, r->D));
  }
  int bad = ref_mismatches(what, acc_o, want_o, no, 1e-5, 1e-6);
  bad += ref_mismatches(what, acc_l, want_l, nl, 1e-5, 1e-6);
  if (bad) fprintf(stderr, "%s: the merged blocks' out or lse off attention over all the keys (above)\n", what);
  CHECK(bad == 0);
  free(acc_o), free(acc_l), free(po), free(pl);
}

static void ring_equals_whole(void) {
  enum { B = 2, T = 136, C = T / 4, Tq = 2 * C, H = 4, Hkv = 2, D = 16 };
  const int64_t nq = (int64_t)B * Tq * H * D, nk = (int64_t)B * T * Hkv * D, nl = (int64_t)B * H * Tq;
  int32_t pos[Tq];
  for (int i = 0; i < C; i++) pos[i] = i, pos[C + i] = 3 * C + i; /* rank 0 of cp 2: chunks 0 and 3 */
  unsigned seed = 47;
  float *q = malloc(4 * nq), *k = malloc(4 * nk), *v = malloc(4 * nk);
  double *q64 = malloc(8 * nq), *k64 = malloc(8 * nk), *v64 = malloc(8 * nk);
  ref_fill(q, q64, nq, &seed, 1.5), ref_fill(k, k64, nk, &seed, 1.5), ref_fill(v, v64, nk, &seed, 1.0);
  /* the op over all the keys at once, and float64 */
  float *out = ref_poisoned(nq), *lse = ref_poisoned(nl);
  CHECK_OK(fsdp_attention_forward_pos(out, lse, q, k, v, pos, B, Tq, T, H, Hkv, D));
  double *want_o = malloc(8 * nq), *want_l = malloc(8 * nl), *o64 = malloc(8 * nq);
  for (int64_t i = 0; i < nq; i++) want_o[i] = out[i];
  for (int64_t i = 0; i < nl; i++) want_l[i] = lse[i];
  ref_attention_pos(B, Tq, T, H, Hkv, D, pos, q64, k64, v64, NULL, o64, NULL, NULL, NULL);
  const ring r = {B, Tq, T, H, Hkv, D, pos, q, k, v};
  const int halves[] = {0, T / 2, T}, chunks[] = {0, C, 2 * C, 3 * C, T}, uneven[] = {0, 50, 51, 120, T};
  const int in_order[] = {0, 1, 2, 3}, ring_1[] = {1, 2, 3, 0}, backwards[] = {1, 0};
  run_ring(&r, halves, in_order, 2, want_o, want_l, "keys in halves");
  run_ring(&r, halves, backwards, 2, want_o, want_l, "keys in halves, the second first");
  run_ring(&r, chunks, in_order, 4, want_o, want_l, "keys in 4 chunks");
  run_ring(&r, chunks, ring_1, 4, want_o, want_l, "keys in 4 chunks from the second");
  run_ring(&r, uneven, ring_1, 4, want_o, want_l, "keys in uneven blocks");
  run_ring(&r, chunks, in_order, 4, o64, want_l, "keys in 4 chunks vs float64");
  free(q), free(k), free(v), free(q64), free(k64), free(v64), free(out), free(lse), free(want_o), free(want_l), free(o64);
}

static int same_bits(const float *a, const float *b, int64_t n) { return memcmp(a, b, sizeof(float) * (size_t)n) == 0; }

/* rows of B 1, T 4, H 2 by query t: 0 both seen, 1 the partial saw
 * nothing, 2 the accumulator saw nothing, 3 neither */
static void unseen_rows(void) {
  enum { T = 4, H = 2, D = 5, NO = T * H * D, NL = H * T };
  unsigned seed = 48;
  float out[NO], ob[NO], lse[NL], lb[NL], out0[NO], lse0[NL];
  ref_fill(out, NULL, NO, &seed, 1.0), ref_fill(ob, NULL, NO, &seed, 1.0);
  ref_fill(lse, NULL, NL, &seed, 2.0), ref_fill(lb, NULL, NL, &seed, 2.0);
  for (int h = 0; h < H; h++) {
    float *ob1 = ob + (1 * H + h) * D, *o2 = out + (2 * H + h) * D;
    float *o3 = out + (3 * H + h) * D, *ob3 = ob + (3 * H + h) * D;
    lb[h * T + 1] = -INFINITY;
    lse[h * T + 2] = -INFINITY;
    lse[h * T + 3] = lb[h * T + 3] = -INFINITY;
    for (int d = 0; d < D; d++) ob1[d] = NAN, o2[d] = NAN, o3[d] = 0, ob3[d] = h ? NAN : 0.0f;
  }
  memcpy(out0, out, sizeof out), memcpy(lse0, lse, sizeof lse);
  CHECK_OK(fsdp_attention_merge(out, lse, ob, lb, 1, T, H, D));
  int kept = 1, taken = 1, none = 1, blended = 1;
  for (int h = 0; h < H; h++) {
    const int r0 = (0 * H + h) * D, r1 = (1 * H + h) * D, r2 = (2 * H + h) * D, r3 = (3 * H + h) * D;
    blended &= lse[h * T] >= lse0[h * T] && lse[h * T] >= lb[h * T];
    for (int d = 0; d < D; d++) blended &= isfinite(out[r0 + d]);
    kept &= same_bits(out + r1, out0 + r1, D) && same_bits(lse + h * T + 1, lse0 + h * T + 1, 1);
    taken &= same_bits(out + r2, ob + r2, D) && same_bits(lse + h * T + 2, lb + h * T + 2, 1);
    for (int d = 0; d < D; d++) none &= out[r3 + d] == 0;
    none &= lse[h * T + 3] == -INFINITY;
  }
  CHECK(blended);
  CHECK(kept);  /* lse_b = -inf: the accumulator bit for bit */
  CHECK(taken); /* lse = -inf: the partial bit for bit */
  CHECK(none);  /* both -inf: zeros and -inf, no NaN */
}

/* more (batch, head) items than a thread's grain: the pool shares them */
static void same_bits_any_threads(void) {
  enum { B = 2, T = 300, H = 8, D = 64 };
  const int64_t no = (int64_t)B * T * H * D, nl = (int64_t)B * H * T;
  unsigned seed = 49;
  float *ob = malloc(4 * no), *lb = malloc(4 * nl), *out[2], *lse[2];
  ref_fill(ob, NULL, no, &seed, 1.0), ref_fill(lb, NULL, nl, &seed, 4.0);
  for (int t = 0; t < 2; t++) {
    unsigned s = 50;
    out[t] = malloc(4 * no), lse[t] = malloc(4 * nl);
    ref_fill(out[t], NULL, no, &s, 1.0), ref_fill(lse[t], NULL, nl, &s, 4.0);
    CHECK_OK(fsdp_cpu_threads_set(t ? 3 : 1));
    CHECK_OK(fsdp_attention_merge(out[t], lse[t], ob, lb, B, T, H, D));
  }
  CHECK(same_bits(out[0], out[1], no) && same_bits(lse[0], lse[1], nl));
  for (int t = 0; t < 2; t++) free(out[t]), free(lse[t]);
  free(ob), free(lb);
}

static void refusals(void) {
  float x[8] = {0};
  CHECK_FAILS(fsdp_attention_merge(x, x, x, x, -1, 1, 1, 1), FSDP_EINVAL, "attention_merge: batch=-1");
  CHECK_FAILS(fsdp_attention_merge(x, x, x, x, 1, -1, 1, 1), FSDP_EINVAL, "seq=-1");
  CHECK_FAILS(fsdp_attention_merge(x, x, x, x, 1, 1, 0, 1), FSDP_EINVAL, "heads=0");
  CHECK_FAILS(fsdp_attention_merge(x, x, x, x, 1, 1, 1, 0), FSDP_EINVAL, "head_dim=0");
  CHECK_FAILS(fsdp_attention_merge(x, x, x, NULL, 1, 2, 1, 4), FSDP_EINVAL, "attention_merge: NULL buffer");
  CHECK_FAILS(fsdp_attention_merge(NULL, x, x, x, 1, 2, 1, 4), FSDP_EINVAL, "attention_merge: NULL buffer");
  /* no rows: nothing is read */
  CHECK_OK(fsdp_attention_merge(NULL, NULL, NULL, NULL, 0, 2, 1, 4));
  CHECK_OK(fsdp_attention_merge(NULL, NULL, NULL, NULL, 2, 0, 1, 4));
}

int main(void) {
  same_bits_any_threads();
  CHECK_OK(fsdp_cpu_threads_set(3));
  random_partials(2, 37, 3, 20, 45);
  random_partials(1, 5, 1, 1, 46); /* head_dim 1 */
  ring_equals_whole();
  unseen_rows();
  refusals();
  return fsdp_test_summary("attention_merge");
}
