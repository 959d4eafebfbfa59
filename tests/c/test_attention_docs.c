/* test_attention_docs: packed rows (several documents in one row) for
 * attention and rope.
 * - Attention with doc_start against a float64 reference in which query i
 *   sees keys doc_start[i] .. i: forward within 1e-5 relative + 1e-6
 *   absolute, backward (dq, dk, dv of L = sum r * out, by the chain rule)
 *   within 1e-4 relative + 1e-5; rows of 1, 3 and 7 documents and of
 *   documents longer than the op's block of 64 query rows (T = 150).
 * - A packed row computes what each of its documents computes alone: the
 *   causal op on each document by itself gives the same out, lse, dq, dk,
 *   dv within 1e-5 relative + 1e-6 (fp32 sums in another grouping: the
 *   op's 64-row blocks start at the row's start, not the document's).
 * - doc_start all 0 (one document) is the causal op, bit for bit.
 * - rope at positions t - doc_start[t] equals rope on each document alone,
 *   bit for bit, and backward_at undoes forward_at within 1e-6.
 * - Malformed doc_start and positions are refused, naming row and position. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ref.h"

typedef struct {
  int B, T, H, Hkv, D;
  const int32_t *ds;
  double *q, *k, *v, *r;
} prob;

/* doc_start for rows made of documents of the given lengths (summing to T) */
static void doc_starts(int32_t *ds, const int *lens, int n) {
  int t = 0;
  for (int d = 0; d < n; d++) {
    for (int i = 0; i < lens[d]; i++) ds[t + i] = t;
    t += lens[d];
  }
}

/* rows b of [B, T, heads, D] x, positions t0 .. t0 + n - 1, into [1, n, heads, D] dst */
static void take(float *dst, const float *x, int b, int T, int heads, int D, int t0, int n) {
  memcpy(dst, x + ((size_t)b * T + t0) * heads * D, sizeof(float) * (size_t)n * heads * D);
}

static int same_bits(const float *a, const float *b, int64_t n) { return memcmp(a, b, sizeof(float) * (size_t)n) == 0; }

/* each document of row b alone through the causal op, against the packed call's rows */
static void check_alone(const prob *p, const float *q, const float *k, const float *v, const float *r, const float *out,
                        const float *lse, const float *dq, const float *dk, const float *dv, const int *lens, int ndocs,
                        int b) {
  int T = p->T, H = p->H, Hkv = p->Hkv, D = p->D;
  for (int d = 0, t0 = 0; d < ndocs; t0 += lens[d], d++) {
    int n = lens[d];
    int64_t nq = (int64_t)n * H * D, nk = (int64_t)n * Hkv * D;
    float *qa = malloc(4 * nq), *ka = malloc(4 * nk), *va = malloc(4 * nk), *ra = malloc(4 * nq);
    float *oa = malloc(4 * nq), *la = malloc(4 * (size_t)H * n), *dqa = malloc(4 * nq), *dka = malloc(4 * nk),
          *dva = malloc(4 * nk), *got = malloc(4 * (nq > nk ? nq : nk));
    take(qa, q, b, T, H, D, t0, n), take(ka, k, b, T, Hkv, D, t0, n), take(va, v, b, T, Hkv, D, t0, n);
    take(ra, r, b, T, H, D, t0, n);
    CHECK_OK(fsdp_attention_forward(oa, la, qa, ka, va, 1, n, H, Hkv, D));
    CHECK_OK(fsdp_attention_backward(dqa, dka, dva, ra, qa, ka, va, oa, la, 1, n, H, Hkv, D));
    double *want = malloc(8 * (nq > nk ? nq : nk));
#define AGAINST(name, packed, alone, heads, cnt)                        \
  do {                                                                  \
    take(got, packed, b, T, heads, D, t0, n);                           \
    for (int64_t i = 0; i < (cnt); i++) want[i] = (alone)[i];           \
    CHECK(ref_mismatches(name, got, want, (cnt), 1e-5, 1e-6) == 0);     \
  } while (0)
    AGAINST("out alone", out, oa, H, nq);
    AGAINST("dq alone", dq, dqa, H, nq);
    AGAINST("dk alone", dk, dka, Hkv, nk);
    AGAINST("dv alone", dv, dva, Hkv, nk);
#undef AGAINST
    for (int h = 0; h < H; h++) { /* lse [B, H, T] */
      for (int i = 0; i < n; i++) want[i] = la[h * n + i];
      CHECK(ref_mismatches("lse alone", lse + ((size_t)b * H + h) * T + t0, want, n, 1e-5, 1e-6) == 0);
    }
    free(qa), free(ka), free(va), free(ra), free(oa), free(la), free(dqa), free(dka), free(dva), free(got), free(want);
  }
}

/* rows: B rows of T, row b made of the documents lens[b][0 .. ndocs[b] - 1] */
static void run(int B, int T, int H, int Hkv, int D, const int lens[][8], const int *ndocs, unsigned seed) {
  int64_t nq = (int64_t)B * T * H * D, nk = (int64_t)B * T * Hkv * D;
  int32_t *ds = malloc(sizeof(int32_t) * (size_t)B * T);
  for (int b = 0; b < B; b++) doc_starts(ds + (size_t)b * T, lens[b], ndocs[b]);
  CHECK_OK(fsdp_doc_start_check(ds, B, T));
  prob p = {B, T, H, Hkv, D, ds, malloc(8 * nq), malloc(8 * nk), malloc(8 * nk), malloc(8 * nq)};
  float *q = malloc(4 * nq), *k = malloc(4 * nk), *v = malloc(4 * nk), *r = malloc(4 * nq);
  ref_fill(q, p.q, nq, &seed, 1.5);
  ref_fill(k, p.k, nk, &seed, 1.5);
  ref_fill(v, p.v, nk, &seed, 1.0);
  ref_fill(r, p.r, nq, &seed, 1.0);
  float *out = ref_poisoned(nq), *lse = ref_poisoned((int64_t)B * H * T);
  float *dq = ref_poisoned(nq), *dk = ref_poisoned(nk), *dv = ref_poisoned(nk);
  CHECK_OK(fsdp_attention_forward_docs(out, lse, q, k, v, ds, B, T, H, Hkv, D));
  CHECK_OK(fsdp_attention_backward_docs(dq, dk, dv, r, q, k, v, out, lse, ds, B, T, H, Hkv, D));
  double *want = malloc(8 * nq), *gq = malloc(8 * nq), *gk = malloc(8 * nk), *gv = malloc(8 * nk);
  ref_attention(B, T, H, Hkv, D, ds, p.q, p.k, p.v, p.r, want, gq, gk, gv);
  CHECK(ref_mismatches("packed out", out, want, nq, 1e-5, 1e-6) == 0);
  CHECK(ref_mismatches("packed dq", dq, gq, nq, 1e-4, 1e-5) == 0);
  CHECK(ref_mismatches("packed dk", dk, gk, nk, 1e-4, 1e-5) == 0);
  CHECK(ref_mismatches("packed dv", dv, gv, nk, 1e-4, 1e-5) == 0);
  for (int b = 0; b < B; b++) check_alone(&p, q, k, v, r, out, lse, dq, dk, dv, lens[b], ndocs[b], b);
  free(want), free(gq), free(gk), free(gv), free(q), free(k), free(v), free(r), free(out), free(lse), free(dq), free(dk),
      free(dv), free(p.q), free(p.k), free(p.v), free(p.r), free(ds);
}

/* one document a row: the causal op's bits */
static void run_causal_bits(int B, int T, int H, int Hkv, int D, unsigned seed) {
  int64_t nq = (int64_t)B * T * H * D, nk = (int64_t)B * T * Hkv * D, nl = (int64_t)B * H * T;
  double *scratch = malloc(8 * nq);
  float *q = malloc(4 * nq), *k = malloc(4 * nk), *v = malloc(4 * nk), *r = malloc(4 * nq);
  ref_fill(q, scratch, nq, &seed, 1.5), ref_fill(k, scratch, nk, &seed, 1.5), ref_fill(v, scratch, nk, &seed, 1.0);
  ref_fill(r, scratch, nq, &seed, 1.0);
  int32_t *ds = calloc((size_t)B * T, sizeof(int32_t));
  float *o1 = malloc(4 * nq), *l1 = malloc(4 * nl), *o2 = malloc(4 * nq), *l2 = malloc(4 * nl);
  float *g1[3] = {malloc(4 * nq), malloc(4 * nk), malloc(4 * nk)}, *g2[3] = {malloc(4 * nq), malloc(4 * nk), malloc(4 * nk)};
  CHECK_OK(fsdp_attention_forward(o1, l1, q, k, v, B, T, H, Hkv, D));
  CHECK_OK(fsdp_attention_forward_docs(o2, l2, q, k, v, ds, B, T, H, Hkv, D));
  CHECK(same_bits(o1, o2, nq) && same_bits(l1, l2, nl));
  CHECK_OK(fsdp_attention_backward(g1[0], g1[1], g1[2], r, q, k, v, o1, l1, B, T, H, Hkv, D));
  CHECK_OK(fsdp_attention_backward_docs(g2[0], g2[1], g2[2], r, q, k, v, o1, l1, ds, B, T, H, Hkv, D));
  CHECK(same_bits(g1[0], g2[0], nq) && same_bits(g1[1], g2[1], nk) && same_bits(g1[2], g2[2], nk));
  for (int i = 0; i < 3; i++) free(g1[i]), free(g2[i]);
  free(scratch), free(q), free(k), free(v), free(r), free(ds), free(o1), free(l1), free(o2), free(l2);
}

static void rope_docs(void) {
  enum { T = 40, HEADS = 3, D = 8 };
  const int lens[] = {7, 1, 20, 12};
  int32_t ds[T], pos[T];
  doc_starts(ds, lens, 4);
  for (int t = 0; t < T; t++) pos[t] = t - ds[t];
  float cos_t[T * D], sin_t[T * D], x[T * HEADS * D], y[T * HEADS * D], alone[T * HEADS * D];
  CHECK_OK(fsdp_rope_table(cos_t, sin_t, T, D, 10000.0, NULL));
  double scratch[T * HEADS * D];
  unsigned seed = 7;
  ref_fill(x, scratch, T * HEADS * D, &seed, 1.0);
  memcpy(y, x, sizeof x);
  CHECK_OK(fsdp_rope_forward_at(y, cos_t, sin_t, pos, 1, T, HEADS, D));
  for (int d = 0, t0 = 0; d < 4; t0 += lens[d], d++) {
    size_t row = (size_t)HEADS * D;
    memcpy(alone, x + t0 * row, sizeof(float) * row * (size_t)lens[d]);
    CHECK_OK(fsdp_rope_forward(alone, cos_t, sin_t, 1, lens[d], HEADS, D));
    CHECK(same_bits(alone, y + t0 * row, (int64_t)row * lens[d]));
  }
  CHECK_OK(fsdp_rope_backward_at(y, cos_t, sin_t, pos, 1, T, HEADS, D));
  double want[T * HEADS * D];
  for (int i = 0; i < T * HEADS * D; i++) want[i] = x[i];
  CHECK(ref_mismatches("rope_at round trip", y, want, T * HEADS * D, 1e-6, 1e-6) == 0);
  pos[5] = T;
  CHECK_FAILS(fsdp_rope_forward_at(y, cos_t, sin_t, pos, 1, T, HEADS, D), FSDP_EINVAL, "position 40 at row 0, 5");
  pos[5] = -1;
  CHECK_FAILS(fsdp_rope_backward_at(y, cos_t, sin_t, pos, 1, T, HEADS, D), FSDP_EINVAL, "outside the table");
  CHECK_FAILS(fsdp_rope_forward_at(y, cos_t, sin_t, NULL, 1, T, HEADS, D), FSDP_EINVAL, "pos is NULL");
}

static void refusals(void) {
  int32_t ds[2 * 6] = {0, 0, 2, 2, 2, 5, 0, 1, 1, 3, 3, 3};
  CHECK_OK(fsdp_doc_start_check(ds, 2, 6));
  ds[1] = 1, ds[0] = 0; /* position 1 starting a document is fine */
  CHECK_OK(fsdp_doc_start_check(ds, 2, 6));
  ds[6] = 3; /* row 1 starts at 3 */
  CHECK_FAILS(fsdp_doc_start_check(ds, 2, 6), FSDP_EINVAL, "row 1 position 0 holds 3");
  ds[6] = 0, ds[10] = 1; /* back into an earlier document */
  CHECK_FAILS(fsdp_doc_start_check(ds, 2, 6), FSDP_EINVAL, "row 1 position 4 holds 1");
  float buf[2 * 6 * 2 * 4] = {0}, lse[2 * 2 * 6];
  CHECK_FAILS(fsdp_attention_forward_docs(buf, lse, buf, buf, buf, ds, 2, 6, 2, 1, 4), FSDP_EINVAL, "row 1 position 4");
  CHECK_FAILS(fsdp_attention_forward_docs(buf, lse, buf, buf, buf, NULL, 2, 6, 2, 1, 4), FSDP_EINVAL,
              "doc_start is NULL");
  CHECK_FAILS(fsdp_attention_backward_docs(buf, buf, buf, buf, buf, buf, buf, buf, lse, ds, 2, 6, 2, 1, 4), FSDP_EINVAL,
              "row 1 position 4");
}

int main(void) {
  CHECK_OK(fsdp_cpu_threads_set(3)); /* the heads shared among threads */
  { /* rows of 1, 3 and 7 documents; GQA; short */
    const int lens[3][8] = {{24}, {5, 1, 18}, {3, 4, 1, 2, 6, 5, 3}};
    const int nd[3] = {1, 3, 7};
    run(3, 24, 4, 2, 8, lens, nd, 11);
  }
  { /* documents across the op's 64-row blocks, a block starting mid-document */
    const int lens[2][8] = {{70, 1, 79}, {30, 64, 40, 16}};
    const int nd[2] = {3, 4};
    run(2, 150, 6, 2, 16, lens, nd, 12);
  }
  { /* heads that fill more than one stack of GEMM rows */
    const int lens[1][8] = {{33, 80, 17}};
    const int nd[1] = {3};
    run(1, 130, 12, 1, 8, lens, nd, 13);
  }
  run_causal_bits(2, 150, 4, 2, 16, 21);
  rope_docs();
  refusals();
  return fsdp_test_summary("attention_docs");
}
