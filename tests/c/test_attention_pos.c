/* test_attention_pos: attention for queries at given positions (a
 * context-parallel rank's rows, issue 46): fsdp_attention_forward_pos /
 * _backward_pos. With cp ranks, rank r holds chunks r and 2 cp - 1 - r of
 * 2 cp equal chunks; its queries see the whole sequence's keys up to
 * their global positions.
 * - Each rank of cp = 2 and cp = 4 (GQA and MHA, batch 2, chunks of 65
 *   rows: blocks of 64 query rows and a 1-row tail in each chunk) against
 *   float64: out within 1e-5 relative + 1e-6 absolute; dq, dk, dv (of L =
 *   sum r * out over the rank's rows, by the chain rule) within 1e-4
 *   relative + 1e-5.
 * - The ranks together are the causal op on the whole sequence: each
 *   rank's out, lse, dq equal its rows of the causal op's, and the ranks'
 *   dk, dv summed (in float64) equal the causal op's dk, dv, within 1e-5
 *   relative + 1e-6 (fp32 sums in another grouping).
 * - cp = 1 (q_pos[i] = i) is the causal op, bit for bit.
 * - A small case (rank 0 of cp = 2, T = 8) against central differences
 *   (h = 1e-5) of L computed in float64: the op within 1e-3 relative +
 *   1e-5, the float64 chain rule within 1e-6 relative + 1e-8.
 * - Positions in any order (repeats, jumps back): each query still sees
 *   keys 0 .. its position (float64, as above; lse too, within out's
 *   tolerance, in every case against float64).
 * - Ring attention's steps (issue 46; GQA 4/2, batch 2): every query at
 *   c - 1 of 2c keys (one run of equal positions, across 64-row blocks),
 *   the first c queries at -1 (seeing no key) and the rest at 2c - 1,
 *   mixed runs (-1, -1, 3, 3, 4, 5, 5, 5), and every query at -1. Rows at
 *   -1: out and dq exactly 0, lse -inf; their dout, out and lse, NaN going
 *   into backward, change nothing (no NaN anywhere); no keys at all (tk =
 *   0, every query at -1) the same.
 * - The same bits with 1 and 3 CPU threads; no queries (tq = 0): dk, dv
 *   overwritten with zeros.
 * - Refusals: a position outside [-1, tk) (naming the query), q_pos NULL,
 *   NULL buffers, heads not a multiple of kv_heads. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ref.h"

/* rank r's positions of a sequence of T in cp ranks: chunks r and 2 cp - 1 - r of 2 cp */
static void cp_positions(int32_t *pos, int T, int cp, int r) {
  const int c = T / (2 * cp);
  for (int i = 0; i < c; i++) pos[i] = r * c + i, pos[c + i] = (2 * cp - 1 - r) * c + i;
}

/* rows pos[0 .. n - 1] of each batch row of [B, T, heads, D] x, into [B, n, heads, D] dst */
static void take_rows(float *dst, const float *x, const int32_t *pos, int n, int B, int T, int heads, int D) {
  const size_t row = (size_t)heads * D;
  for (int b = 0; b < B; b++)
    for (int i = 0; i < n; i++) memcpy(dst + ((size_t)b * n + i) * row, x + ((size_t)b * T + pos[i]) * row, 4 * row);
}

static int same_bits(const float *a, const float *b, int64_t n) { return memcmp(a, b, sizeof(float) * (size_t)n) == 0; }

static double *widen(const float *x, int64_t n) {
  double *d = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) d[i] = x[i];
  return d;
}

/* one rank's call: its rows of q and r; the whole k, v */
typedef struct {
  int B, Tq, Tk, H, Hkv, D;
  const int32_t *pos;
  double *q, *k, *v, *r;
} prob;

/* lse against float64: -inf (a row that sees no key) exactly, else as out */
static int lse_mismatches(const char *what, const float *got, const double *want, int64_t n) {
  int bad = 0;
  for (int64_t i = 0; i < n; i++)
    bad += isinf(want[i]) ? got[i] != (float)want[i] : ref_mismatches(what, got + i, want + i, 1, 1e-5, 1e-6);
  return bad;
}

/* rows at -1 (no key): x's D values of each head exactly 0 */
static int nonzero_unseen(const float *x, const int32_t *pos, int B, int Tq, int H, int D) {
  int bad = 0;
  for (int64_t e = 0; e < (int64_t)B * Tq * H * D; e++) bad += pos[e / ((int64_t)H * D) % Tq] < 0 && x[e] != 0.0f;
  return bad;
}

/* forward and backward of the op on p's inputs (as floats), and both
 * against float64; between them the out and lse of rows at -1 become NaN
 * (the ring's backward hands the merged ones over: not to be read) */
static void op_vs_float64(const prob *p, const float *q, const float *k, const float *v, const float *r, float *out,
                          float *lse, float *dq, float *dk, float *dv, const char *what) {
  const int B = p->B, Tq = p->Tq, Tk = p->Tk, H = p->H, Hkv = p->Hkv, D = p->D;
  const int64_t nq = (int64_t)B * Tq * H * D, nk = (int64_t)B * Tk * Hkv * D, nl = (int64_t)B * H * Tq;
  double *want = malloc(8 * nq), *wl = malloc(8 * nl), *gq = malloc(8 * nq), *gk = malloc(8 * nk), *gv = malloc(8 * nk);
  ref_attention_pos_lse(B, Tq, Tk, H, Hkv, D, p->pos, p->q, p->k, p->v, p->r, want, wl, gq, gk, gv);
  CHECK_OK(fsdp_attention_forward_pos(out, lse, q, k, v, p->pos, B, Tq, Tk, H, Hkv, D));
  int bad = ref_mismatches(what, out, want, nq, 1e-5, 1e-6) + lse_mismatches(what, lse, wl, nl);
  bad += nonzero_unseen(out, p->pos, B, Tq, H, D);
  for (int64_t e = 0; e < nq; e++)
    if (p->pos[e / ((int64_t)H * D) % Tq] < 0) out[e] = NAN;
  for (int64_t e = 0; e < nl; e++)
    if (p->pos[e % Tq] < 0) lse[e] = NAN;
  CHECK_OK(fsdp_attention_backward_pos(dq, dk, dv, r, q, k, v, out, lse, p->pos, B, Tq, Tk, H, Hkv, D));
  bad += ref_mismatches(what, dq, gq, nq, 1e-4, 1e-5) + nonzero_unseen(dq, p->pos, B, Tq, H, D);
  bad += ref_mismatches(what, dk, gk, nk, 1e-4, 1e-5);
  bad += ref_mismatches(what, dv, gv, nk, 1e-4, 1e-5);
  if (bad) fprintf(stderr, "%s: out, lse, dq, dk or dv off float64 (above), or a row at -1 not 0\n", what);
  CHECK(bad == 0);
  free(want), free(wl), free(gq), free(gk), free(gv);
}

/* the whole sequence split over cp ranks, each rank against float64 and
 * against the causal op on the whole sequence */
static void run_cp(int B, int T, int H, int Hkv, int D, int cp, unsigned seed) {
  const int Tq = T / cp;
  const int64_t nq = (int64_t)B * T * H * D, nk = (int64_t)B * T * Hkv * D, nl = (int64_t)B * H * T;
  const int64_t rq = (int64_t)B * Tq * H * D, rl = (int64_t)B * H * Tq;
  float *q = malloc(4 * nq), *k = malloc(4 * nk), *v = malloc(4 * nk), *r = malloc(4 * nq);
  double *scratch = malloc(8 * nq);
  ref_fill(q, scratch, nq, &seed, 1.5), ref_fill(k, scratch, nk, &seed, 1.5), ref_fill(v, scratch, nk, &seed, 1.0);
  ref_fill(r, scratch, nq, &seed, 1.0);
  /* the causal op on the whole sequence */
  float *out = ref_poisoned(nq), *lse = ref_poisoned(nl), *dq = ref_poisoned(nq), *dk = ref_poisoned(nk),
        *dv = ref_poisoned(nk);
  CHECK_OK(fsdp_attention_forward(out, lse, q, k, v, B, T, H, Hkv, D));
  CHECK_OK(fsdp_attention_backward(dq, dk, dv, r, q, k, v, out, lse, B, T, H, Hkv, D));
  int32_t *pos = malloc(sizeof(int32_t) * (size_t)Tq);
  float *qr = malloc(4 * rq), *rr = malloc(4 * rq), *tk = malloc(4 * rq);
  float *o = ref_poisoned(rq), *l = ref_poisoned(rl), *gq = ref_poisoned(rq), *gk = ref_poisoned(nk),
        *gv = ref_poisoned(nk);
  double *sk = calloc((size_t)nk, 8), *sv = calloc((size_t)nk, 8), *want = malloc(8 * (rq > nk ? rq : nk));
  prob p = {B, Tq, T, H, Hkv, D, pos, NULL, widen(k, nk), widen(v, nk), NULL};
  char what[96];
  for (int rank = 0; rank < cp; rank++) {
    cp_positions(pos, T, cp, rank);
    take_rows(qr, q, pos, Tq, B, T, H, D), take_rows(rr, r, pos, Tq, B, T, H, D);
    p.q = widen(qr, rq), p.r = widen(rr, rq);
    snprintf(what, sizeof what, "cp %d rank %d, T %d, heads %d/%d", cp, rank, T, H, Hkv);
    op_vs_float64(&p, qr, k, v, rr, o, l, gq, gk, gv, what);
    /* the causal op's rows */
    take_rows(tk, out, pos, Tq, B, T, H, D);
    for (int64_t i = 0; i < rq; i++) want[i] = tk[i];
    CHECK(ref_mismatches("out vs the causal op's", o, want, rq, 1e-5, 1e-6) == 0);
    take_rows(tk, dq, pos, Tq, B, T, H, D);
    for (int64_t i = 0; i < rq; i++) want[i] = tk[i];
    CHECK(ref_mismatches("dq vs the causal op's", gq, want, rq, 1e-5, 1e-6) == 0);
    for (int b = 0; b < B; b++)
      for (int h = 0; h < H; h++)
        for (int i = 0; i < Tq; i++) want[((int64_t)b * H + h) * Tq + i] = lse[((int64_t)b * H + h) * T + pos[i]];
    CHECK(ref_mismatches("lse vs the causal op's", l, want, rl, 1e-5, 1e-6) == 0);
    if (cp == 1) { /* q_pos[i] = i: the causal computation */
      CHECK(same_bits(o, out, nq) && same_bits(l, lse, nl));
      CHECK(same_bits(gq, dq, nq) && same_bits(gk, dk, nk) && same_bits(gv, dv, nk));
    }
    for (int64_t i = 0; i < nk; i++) sk[i] += gk[i], sv[i] += gv[i];
    free(p.q), free(p.r);
  }
  /* the ranks' dk, dv reduced: the causal op's */
  CHECK(ref_mismatches("causal dk vs the ranks' summed", dk, sk, nk, 1e-5, 1e-6) == 0);
  CHECK(ref_mismatches("causal dv vs the ranks' summed", dv, sv, nk, 1e-5, 1e-6) == 0);
  free(q), free(k), free(v), free(r), free(scratch), free(out), free(lse), free(dq), free(dk), free(dv), free(pos);
  free(qr), free(rr), free(tk), free(o), free(l), free(gq), free(gk), free(gv), free(sk), free(sv), free(want);
  free(p.k), free(p.v);
}

/* L = sum r * out, float64, for the central differences */
static double ref_loss(void *ctx) {
  const prob *p = ctx;
  const int64_t n = (int64_t)p->B * p->Tq * p->H * p->D;
  double *o = malloc(sizeof(double) * (size_t)n), L = 0;
  ref_attention_pos(p->B, p->Tq, p->Tk, p->H, p->Hkv, p->D, p->pos, p->q, p->k, p->v, p->r, o, NULL, NULL, NULL);
  for (int64_t i = 0; i < n; i++) L += p->r[i] * o[i];
  free(o);
  return L;
}

/* given positions (q_pos, tq of them) of tk keys: the op against float64,
 * and with central, also against central differences of L. The dout
 * rows of queries at -1 are NaN (not to be read; float64 ignores them). */
static void run_pos(const char *what, int B, int Tq, int Tk, int H, int Hkv, int D, const int32_t *pos, int central,
                    unsigned seed) {
  const int64_t nq = (int64_t)B * Tq * H * D, nk = (int64_t)B * Tk * Hkv * D;
  prob p = {B, Tq, Tk, H, Hkv, D, pos, malloc(8 * nq), malloc(8 * nk), malloc(8 * nk), malloc(8 * nq)};
  float *q = malloc(4 * nq), *k = malloc(4 * nk), *v = malloc(4 * nk), *r = malloc(4 * nq);
  ref_fill(q, p.q, nq, &seed, 1.5), ref_fill(k, p.k, nk, &seed, 1.5), ref_fill(v, p.v, nk, &seed, 1.0);
  ref_fill(r, p.r, nq, &seed, 1.0);
  for (int64_t e = 0; e < nq; e++)
    if (pos[e / ((int64_t)H * D) % Tq] < 0) r[e] = NAN;
  float *out = ref_poisoned(nq), *lse = ref_poisoned((int64_t)B * H * Tq), *dq = ref_poisoned(nq),
        *dk = ref_poisoned(nk), *dv = ref_poisoned(nk);
  op_vs_float64(&p, q, k, v, r, out, lse, dq, dk, dv, what);
  if (central) {
    double *cq = malloc(8 * nq), *ck = malloc(8 * nk), *cv = malloc(8 * nk);
    for (int64_t i = 0; i < nq; i++) cq[i] = ref_central(ref_loss, &p, &p.q[i], 1e-5);
    for (int64_t i = 0; i < nk; i++) ck[i] = ref_central(ref_loss, &p, &p.k[i], 1e-5);
    for (int64_t i = 0; i < nk; i++) cv[i] = ref_central(ref_loss, &p, &p.v[i], 1e-5);
    CHECK(ref_mismatches("dq vs central", dq, cq, nq, 1e-3, 1e-5) == 0);
    CHECK(ref_mismatches("dk vs central", dk, ck, nk, 1e-3, 1e-5) == 0);
    CHECK(ref_mismatches("dv vs central", dv, cv, nk, 1e-3, 1e-5) == 0);
    /* the float64 chain rule the long cases are held to, checked here */
    double *aq = malloc(8 * nq), *ak = malloc(8 * nk), *av = malloc(8 * nk), *ao = malloc(8 * nq);
    ref_attention_pos(B, Tq, Tk, H, Hkv, D, pos, p.q, p.k, p.v, p.r, ao, aq, ak, av);
    CHECK(ref_mismatches64("float64 dq vs central", aq, cq, nq, 1e-6, 1e-8) == 0);
    CHECK(ref_mismatches64("float64 dk vs central", ak, ck, nk, 1e-6, 1e-8) == 0);
    CHECK(ref_mismatches64("float64 dv vs central", av, cv, nk, 1e-6, 1e-8) == 0);
    free(cq), free(ck), free(cv), free(aq), free(ak), free(av), free(ao);
  }
  free(p.q), free(p.k), free(p.v), free(p.r), free(q), free(k), free(v), free(r), free(out), free(lse), free(dq),
      free(dk), free(dv);
}

/* rank 0 of cp = 2 with 1 and with 3 threads (12 heads of a group: two stacks) */
static void same_bits_any_threads(void) {
  enum { B = 2, T = 260, Tq = 130, H = 12, Hkv = 2, D = 16 };
  const int64_t nq = (int64_t)B * Tq * H * D, nk = (int64_t)B * T * Hkv * D, nl = (int64_t)B * H * Tq;
  int32_t pos[Tq];
  cp_positions(pos, T, 2, 0);
  unsigned seed = 31;
  float *q = malloc(4 * nq), *k = malloc(4 * nk), *v = malloc(4 * nk), *r = malloc(4 * nq);
  ref_fill(q, NULL, nq, &seed, 1.5), ref_fill(k, NULL, nk, &seed, 1.5), ref_fill(v, NULL, nk, &seed, 1.0);
  ref_fill(r, NULL, nq, &seed, 1.0);
  float *o[2], *l[2], *gq[2], *gk[2], *gv[2];
  for (int t = 0; t < 2; t++) {
    o[t] = ref_poisoned(nq), l[t] = ref_poisoned(nl), gq[t] = ref_poisoned(nq), gk[t] = ref_poisoned(nk),
    gv[t] = ref_poisoned(nk);
    CHECK_OK(fsdp_cpu_threads_set(t ? 3 : 1));
    CHECK_OK(fsdp_attention_forward_pos(o[t], l[t], q, k, v, pos, B, Tq, T, H, Hkv, D));
    CHECK_OK(fsdp_attention_backward_pos(gq[t], gk[t], gv[t], r, q, k, v, o[t], l[t], pos, B, Tq, T, H, Hkv, D));
  }
  CHECK(same_bits(o[0], o[1], nq) && same_bits(l[0], l[1], nl));
  CHECK(same_bits(gq[0], gq[1], nq) && same_bits(gk[0], gk[1], nk) && same_bits(gv[0], gv[1], nk));
  for (int t = 0; t < 2; t++) free(o[t]), free(l[t]), free(gq[t]), free(gk[t]), free(gv[t]);
  free(q), free(k), free(v), free(r);
}

/* ring attention's steps over a block of 2c keys (cp_ring.lua), and runs
 * of equal positions mixed with rows that see nothing */
static void ring_steps(void) {
  enum { C = 70, C2 = 2 * C }; /* 140 queries: blocks of 64 rows cut inside the runs */
  int32_t pos[C2];
  for (int i = 0; i < C2; i++) pos[i] = C - 1;
  run_pos("every query at c - 1 of 2c keys", 2, C2, C2, 4, 2, 8, pos, 0, 47);
  for (int i = 0; i < C2; i++) pos[i] = i < C ? -1 : C2 - 1;
  run_pos("the first c queries at -1, the rest at 2c - 1", 2, C2, C2, 4, 2, 8, pos, 0, 48);
  const int32_t mixed[12] = {-1, -1, 3, 3, 4, 5, 5, 5, -1, 0, 0, 9};
  run_pos("mixed runs", 2, 12, 10, 4, 2, 8, mixed, 0, 49);
  for (int i = 0; i < 6; i++) pos[i] = -1;
  run_pos("every query at -1", 2, 6, 10, 4, 2, 8, pos, 0, 50);
}

/* no keys (tk 0), every query at -1: out 0, lse -inf, dq 0 */
static void no_keys(void) {
  enum { B = 2, TQ = 3, H = 4, HKV = 2, D = 4, NQ = B * TQ * H * D, NL = B * H * TQ };
  const int32_t pos[TQ] = {-1, -1, -1};
  float x[NQ] = {0}, *out = ref_poisoned(NQ), *lse = ref_poisoned(NL), *dq = ref_poisoned(NQ);
  CHECK_OK(fsdp_attention_forward_pos(out, lse, x, x, x, pos, B, TQ, 0, H, HKV, D));
  CHECK_OK(fsdp_attention_backward_pos(dq, x, x, x, x, x, x, out, lse, pos, B, TQ, 0, H, HKV, D));
  int ok = 1;
  for (int i = 0; i < NQ; i++) ok &= out[i] == 0 && dq[i] == 0;
  for (int i = 0; i < NL; i++) ok &= lse[i] == -INFINITY;
  CHECK(ok);
  free(out), free(lse), free(dq);
}

static void no_queries(void) {
  enum { B = 2, T = 5, Hkv = 1, D = 4, NK = B * T * Hkv * D };
  float x = 0, k[NK] = {0}, *dk = ref_poisoned(NK), *dv = ref_poisoned(NK);
  CHECK_OK(fsdp_attention_forward_pos(NULL, NULL, NULL, k, k, NULL, B, 0, T, 2, Hkv, D));
  CHECK_OK(fsdp_attention_backward_pos(NULL, dk, dv, NULL, NULL, k, k, NULL, NULL, NULL, B, 0, T, 2, Hkv, D));
  int zero = 1;
  for (int i = 0; i < NK; i++) zero &= dk[i] == 0 && dv[i] == 0;
  CHECK(zero);
  CHECK_FAILS(fsdp_attention_backward_pos(&x, NULL, dv, &x, &x, k, k, &x, &x, NULL, B, 0, T, 2, Hkv, D), FSDP_EINVAL,
              "NULL buffer");
  free(dk), free(dv);
}

static void refusals(void) {
  enum { B = 1, TQ = 4, TK = 16, H = 2, HKV = 1, D = 4 };
  static float buf[B * TK * H * D], lse[B * H * TQ];
  int32_t pos[TQ] = {0, 1, 14, 15};
  CHECK_OK(fsdp_attention_pos_check(pos, TQ, TK));
  CHECK_OK(fsdp_attention_forward_pos(buf, lse, buf, buf, buf, pos, B, TQ, TK, H, HKV, D));
  pos[1] = -1; /* sees no key */
  CHECK_OK(fsdp_attention_pos_check(pos, TQ, TK));
  pos[1] = 1, pos[3] = TK;
  CHECK_FAILS(fsdp_attention_pos_check(pos, TQ, TK), FSDP_EINVAL, "query 3 at position 16, outside [-1, 16)");
  CHECK_FAILS(fsdp_attention_forward_pos(buf, lse, buf, buf, buf, pos, B, TQ, TK, H, HKV, D), FSDP_EINVAL,
              "attention_forward_pos: q_pos: query 3 at position 16");
  CHECK_FAILS(fsdp_attention_backward_pos(buf, buf, buf, buf, buf, buf, buf, buf, lse, pos, B, TQ, TK, H, HKV, D),
              FSDP_EINVAL, "attention_backward_pos: q_pos: query 3 at position 16");
  pos[3] = 15, pos[1] = -2;
  CHECK_FAILS(fsdp_attention_forward_pos(buf, lse, buf, buf, buf, pos, B, TQ, TK, H, HKV, D), FSDP_EINVAL,
              "query 1 at position -2, outside [-1, 16): one of the 16 keys, or -1");
  pos[1] = 1; /* no keys at all */
  CHECK_FAILS(fsdp_attention_forward_pos(buf, lse, buf, buf, buf, pos, B, TQ, 0, H, HKV, D), FSDP_EINVAL,
              "query 0 at position 0, outside [-1, 0)");
  CHECK_FAILS(fsdp_attention_forward_pos(buf, lse, buf, buf, buf, NULL, B, TQ, TK, H, HKV, D), FSDP_EINVAL,
              "q_pos is NULL");
  CHECK_FAILS(fsdp_attention_backward_pos(buf, buf, buf, buf, buf, buf, buf, buf, lse, NULL, B, TQ, TK, H, HKV, D),
              FSDP_EINVAL, "q_pos is NULL");
  CHECK_FAILS(fsdp_attention_forward_pos(buf, NULL, buf, buf, buf, pos, B, TQ, TK, H, HKV, D), FSDP_EINVAL,
              "NULL buffer");
  CHECK_FAILS(fsdp_attention_backward_pos(buf, buf, NULL, buf, buf, buf, buf, buf, lse, pos, B, TQ, TK, H, HKV, D),
              FSDP_EINVAL, "NULL buffer");
  CHECK_FAILS(fsdp_attention_forward_pos(buf, lse, buf, buf, buf, pos, B, TQ, TK, 3, 2, D), FSDP_EINVAL,
              "multiple of kv_heads");
  CHECK_FAILS(fsdp_attention_forward_pos(buf, lse, buf, buf, buf, pos, B, -1, TK, H, HKV, D), FSDP_EINVAL, "seq=-1");
}

int main(void) {
  same_bits_any_threads();
  CHECK_OK(fsdp_cpu_threads_set(3)); /* the heads shared among threads */
  run_cp(2, 150, 4, 2, 8, 1, 41);   /* cp 1: the causal op's bits */
  run_cp(2, 260, 6, 2, 16, 2, 42);  /* GQA; chunks of 65: a 64-row block and a 1-row one each */
  run_cp(2, 520, 4, 4, 16, 4, 43);  /* MHA */
  run_cp(2, 48, 6, 3, 8, 4, 44);    /* chunks of 6 rows, GQA */
  {
    const int32_t pos[4] = {0, 1, 6, 7}; /* rank 0 of cp 2, T 8 */
    run_pos("central-difference case", 2, 4, 8, 4, 2, 4, pos, 1, 45);
  }
  {
    const int32_t pos[9] = {19, 0, 5, 5, 6, 7, 3, 2, 19}; /* repeats, jumps back */
    run_pos("positions in any order", 2, 9, 20, 6, 3, 8, pos, 0, 46);
  }
  ring_steps();
  no_keys();
  no_queries();
  refusals();
  return fsdp_test_summary("attention_pos");
}
