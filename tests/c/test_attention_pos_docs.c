/* test_attention_pos_docs: attention for queries at given positions over
 * packed rows (context parallelism over documents):
 * fsdp_attention_forward_pos_docs / _backward_pos_docs, query i of batch
 * row b seeing keys q_lo[b, i] .. q_pos[i] of a block of tk keys.
 * - Against float64 (ref_attention_pos_docs): out within 1e-5 relative +
 *   1e-6 absolute, lse the same (-inf exactly where a row sees no key);
 *   dq, dk, dv (of L = sum r * out, by the chain rule) within 1e-4
 *   relative + 1e-5 (test_attention_pos's tolerances). Every case below
 *   is held to these.
 * - Rows that see no key (q_lo = q_pos + 1, q_pos -1 among them): out and
 *   dq rows exactly +0, lse -inf; their dout, out, lse NaN going into
 *   backward, and their q scaled by 1000, change no bit of the other rows'
 *   out, lse, dq nor of dk, dv (nothing to dk, dv); no NaN anywhere.
 * - q_lo all 0 is fsdp_attention_forward_pos / _backward_pos, bit for bit
 *   (cp layouts, ring steps with rows at -1, runs of one position).
 * - Ring attention's layout (cp = 2, chunks of c = 40 rows: blocks of 64
 *   query rows cut inside runs): every rank's 2c queries against every
 *   rank's block of 2c keys, q_pos and q_lo as fsdp.cp computes them from
 *   doc_start (keys of the block before the query's position, before its
 *   document's start); batch 2, each row its own documents (of 1 to 100
 *   tokens), so that rows see part of a block, all of it, or none. GQA 4/2
 *   and head_dim 16 and 64. Each rank's steps merged
 *   (fsdp_attention_merge) are fsdp_attention_forward_docs's rows of the
 *   whole sequence: out, lse within 1e-5 relative + 1e-6.
 * - Layouts beyond the ring's: a row that sees no key between rows that
 *   do, in a run of positions rising by one and in a run of one position
 *   (q_lo falling there, which the rule allows), inside one 64-row block.
 * - A small case against central differences (h = 1e-5) of L in float64:
 *   the op within 1e-3 relative + 1e-5, the float64 chain rule within 1e-6
 *   relative + 1e-8.
 * - No keys (tk 0, every q_pos -1: k, v, dk, dv may be NULL); no queries
 *   (tq 0: dk, dv zeros).
 * - Refusals naming the batch row and query: q_lo outside [0, q_pos + 1],
 *   q_lo falling within a run of positions rising by one; q_lo or q_pos
 *   NULL; a position outside [-1, tk). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ref.h"

typedef struct {
  int B, Tq, Tk, H, Hkv, D;
  const int32_t *pos, *lo;
} dims;

static int same_bits(const float *a, const float *b, int64_t n) { return memcmp(a, b, sizeof(float) * (size_t)n) == 0; }

static int64_t nq_of(const dims *p) { return (int64_t)p->B * p->Tq * p->H * p->D; }
static int64_t nk_of(const dims *p) { return (int64_t)p->B * p->Tk * p->Hkv * p->D; }
static int64_t nl_of(const dims *p) { return (int64_t)p->B * p->H * p->Tq; }

/* element e of a [B, Tq, H, D] tensor (row) or of a [B, H, Tq] one (lse): its query sees no key */
static int row_unseen(const dims *p, int64_t e) {
  const int64_t hd = (int64_t)p->H * p->D, b = e / ((int64_t)p->Tq * hd), i = e / hd % p->Tq;
  return p->lo[b * p->Tq + i] == p->pos[i] + 1;
}
static int lse_unseen(const dims *p, int64_t e) {
  const int64_t b = e / ((int64_t)p->H * p->Tq), i = e % p->Tq;
  return p->lo[b * p->Tq + i] == p->pos[i] + 1;
}

static int nans(const float *x, int64_t n) {
  int c = 0;
  for (int64_t i = 0; i < n; i++) c += isnan(x[i]) != 0;
  return c;
}

/* rows that see no key: x exactly +0 (out, dq) */
static int unseen_not_zero(const dims *p, const float *x) {
  int bad = 0;
  for (int64_t e = 0; e < nq_of(p); e++) bad += row_unseen(p, e) && (x[e] != 0.0f || signbit(x[e]));
  return bad;
}

/* lse against float64: -inf (no key) exactly, else as out */
static int lse_mismatches(const char *what, const float *got, const double *want, int64_t n) {
  int bad = 0;
  for (int64_t i = 0; i < n; i++)
    bad += isinf(want[i]) ? got[i] != (float)want[i] : ref_mismatches(what, got + i, want + i, 1, 1e-5, 1e-6);
  return bad;
}

/* one call's inputs, float and float64 (r: dout, NaN in rows that see no key) */
typedef struct {
  float *q, *k, *v, *r;
  double *qd, *kd, *vd, *rd;
} inputs;

static inputs make_inputs(const dims *p, unsigned seed) {
  const int64_t nq = nq_of(p), nk = nk_of(p);
  inputs x = {malloc(4 * nq + 4), malloc(4 * nk + 4), malloc(4 * nk + 4), malloc(4 * nq + 4),
              malloc(8 * nq + 8), malloc(8 * nk + 8), malloc(8 * nk + 8), malloc(8 * nq + 8)};
  ref_fill(x.q, x.qd, nq, &seed, 1.5), ref_fill(x.k, x.kd, nk, &seed, 1.5), ref_fill(x.v, x.vd, nk, &seed, 1.0);
  ref_fill(x.r, x.rd, nq, &seed, 1.0);
  for (int64_t e = 0; e < nq; e++)
    if (row_unseen(p, e)) x.r[e] = NAN;
  return x;
}

static void free_inputs(inputs *x) {
  free(x->q), free(x->k), free(x->v), free(x->r), free(x->qd), free(x->kd), free(x->vd), free(x->rd);
}

typedef struct {
  float *out, *lse, *dq, *dk, *dv;
} results;

/* forward, then backward with the out and lse of rows that see no key NaN
 * (the ring's backward hands the merged ones over: not to be read) */
static results run_op(const dims *p, const inputs *x) {
  results o = {ref_poisoned(nq_of(p)), ref_poisoned(nl_of(p)), ref_poisoned(nq_of(p)), ref_poisoned(nk_of(p)),
               ref_poisoned(nk_of(p))};
  CHECK_OK(fsdp_attention_forward_pos_docs(o.out, o.lse, x->q, x->k, x->v, p->pos, p->lo, p->B, p->Tq, p->Tk, p->H,
                                           p->Hkv, p->D));
  float *out = malloc(4 * nq_of(p) + 4), *lse = malloc(4 * nl_of(p) + 4);
  memcpy(out, o.out, 4 * nq_of(p)), memcpy(lse, o.lse, 4 * nl_of(p));
  for (int64_t e = 0; e < nq_of(p); e++)
    if (row_unseen(p, e)) out[e] = NAN;
  for (int64_t e = 0; e < nl_of(p); e++)
    if (lse_unseen(p, e)) lse[e] = NAN;
  CHECK_OK(fsdp_attention_backward_pos_docs(o.dq, o.dk, o.dv, x->r, x->q, x->k, x->v, out, lse, p->pos, p->lo, p->B,
                                            p->Tq, p->Tk, p->H, p->Hkv, p->D));
  free(out), free(lse);
  return o;
}

static void free_results(results *o) { free(o->out), free(o->lse), free(o->dq), free(o->dk), free(o->dv); }

/* the op against float64 and the rules for rows that see no key; the
 * results returned (free_results) */
static results check_case(const char *what, const dims *p, const inputs *x) {
  const int64_t nq = nq_of(p), nk = nk_of(p), nl = nl_of(p);
  double *want = malloc(8 * nq + 8), *wl = malloc(8 * nl + 8), *gq = malloc(8 * nq + 8), *gk = malloc(8 * nk + 8),
         *gv = malloc(8 * nk + 8);
  ref_attention_pos_docs(p->B, p->Tq, p->Tk, p->H, p->Hkv, p->D, p->pos, p->lo, x->qd, x->kd, x->vd, x->rd, want, wl,
                         gq, gk, gv);
  results o = run_op(p, x);
  int bad = ref_mismatches(what, o.out, want, nq, 1e-5, 1e-6) + lse_mismatches(what, o.lse, wl, nl);
  bad += ref_mismatches(what, o.dq, gq, nq, 1e-4, 1e-5) + ref_mismatches(what, o.dk, gk, nk, 1e-4, 1e-5) +
         ref_mismatches(what, o.dv, gv, nk, 1e-4, 1e-5);
  int unseen = unseen_not_zero(p, o.out) + unseen_not_zero(p, o.dq);
  for (int64_t e = 0; e < nl; e++) unseen += lse_unseen(p, e) && o.lse[e] != -INFINITY;
  const int nan = nans(o.out, nq) + nans(o.lse, nl) + nans(o.dq, nq) + nans(o.dk, nk) + nans(o.dv, nk);
  if (bad || unseen || nan)
    fprintf(stderr, "%s: %d off float64 (above), %d values of rows that see no key not 0 / -inf, %d NaN\n", what, bad,
            unseen, nan);
  CHECK(bad == 0 && unseen == 0 && nan == 0);
  /* the q of rows that see no key changes nothing (nothing to dk, dv) */
  inputs y = *x;
  y.q = malloc(4 * nq + 4);
  for (int64_t e = 0; e < nq; e++) y.q[e] = row_unseen(p, e) ? 1000.0f * x->q[e] : x->q[e];
  results o2 = run_op(p, &y);
  CHECK(same_bits(o2.out, o.out, nq) && same_bits(o2.lse, o.lse, nl) && same_bits(o2.dq, o.dq, nq));
  CHECK(same_bits(o2.dk, o.dk, nk) && same_bits(o2.dv, o.dv, nk));
  free_results(&o2), free(y.q);
  free(want), free(wl), free(gq), free(gk), free(gv);
  return o;
}

static void run_case(const char *what, const dims *p, unsigned seed) {
  inputs x = make_inputs(p, seed);
  results o = check_case(what, p, &x);
  free_results(&o), free_inputs(&x);
}

/* (a) q_lo all 0: the _pos call's bits */
static void same_as_pos(const char *what, int B, int Tq, int Tk, int H, int Hkv, int D, const int32_t *pos,
                        unsigned seed) {
  int32_t *lo = calloc((size_t)B * Tq + 1, sizeof(int32_t));
  const dims p = {B, Tq, Tk, H, Hkv, D, pos, lo};
  const int64_t nq = nq_of(&p), nk = nk_of(&p), nl = nl_of(&p);
  inputs x = make_inputs(&p, seed);
  results o = check_case(what, &p, &x);
  float *out = ref_poisoned(nq), *lse = ref_poisoned(nl), *dq = ref_poisoned(nq), *dk = ref_poisoned(nk),
        *dv = ref_poisoned(nk);
  CHECK_OK(fsdp_attention_forward_pos(out, lse, x.q, x.k, x.v, pos, B, Tq, Tk, H, Hkv, D));
  CHECK_OK(fsdp_attention_backward_pos(dq, dk, dv, x.r, x.q, x.k, x.v, out, lse, pos, B, Tq, Tk, H, Hkv, D));
  CHECK(same_bits(o.out, out, nq) && same_bits(o.lse, lse, nl));
  CHECK(same_bits(o.dq, dq, nq) && same_bits(o.dk, dk, nk) && same_bits(o.dv, dv, nk));
  free(out), free(lse), free(dq), free(dk), free(dv), free(lo);
  free_results(&o), free_inputs(&x);
}

/* the global position of query i of a rank, and of key i of its block:
 * chunks r and 2 cp - 1 - r of 2 cp chunks of c */
static int global_of(int cp, int c, int r, int i) { return i < c ? r * c + i : (2 * cp - 1 - r) * c + i - c; }

/* rank src's block: how many of its keys sit before global position g */
static int keys_before(int cp, int c, int src, int g) {
  int n = 0;
  for (int i = 0; i < 2 * c; i++) n += global_of(cp, c, src, i) < g;
  return n;
}

/* doc_start for rows made of documents of the given lengths (summing to T) */
static void doc_starts(int32_t *ds, const int *lens, int n) {
  for (int d = 0, t = 0; d < n; t += lens[d], d++)
    for (int i = 0; i < lens[d]; i++) ds[t + i] = t;
}

/* rows pos[0 .. n - 1] of each batch row of [B, T, heads, D] x, into [B, n, heads, D] dst */
static void take_rows(float *dst, const float *x, const int32_t *pos, int n, int B, int T, int heads, int D) {
  const size_t row = (size_t)heads * D;
  for (int b = 0; b < B; b++)
    for (int i = 0; i < n; i++) memcpy(dst + ((size_t)b * n + i) * row, x + ((size_t)b * T + pos[i]) * row, 4 * row);
}

/* (b, c, d) ring attention's layout over cp = 2 ranks, chunks of C rows,
 * batch 2 with different documents; each rank's steps merged against the
 * _docs op on the whole sequence */
static void ring_layout(int H, int Hkv, int D, unsigned seed) {
  enum { CP = 2, C = 40, T = 2 * CP * C, TL = 2 * C, B = 2 };
  /* chunks [0, 40) [40, 80) [80, 120) [120, 160) */
  static const int lens0[] = {30, 50, 45, 35}, lens1[] = {100, 3, 1, 56};
  int32_t ds[B * T], gpos[TL], pos[TL], lo[B * TL];
  doc_starts(ds, lens0, 4), doc_starts(ds + T, lens1, 4);
  const int64_t nq = (int64_t)B * T * H * D, nk = (int64_t)B * T * Hkv * D, rq = (int64_t)B * TL * H * D,
                rk = (int64_t)B * TL * Hkv * D, rl = (int64_t)B * H * TL;
  float *q = malloc(4 * nq), *k = malloc(4 * nk), *v = malloc(4 * nk);
  ref_fill(q, NULL, nq, &seed, 1.5), ref_fill(k, NULL, nk, &seed, 1.5), ref_fill(v, NULL, nk, &seed, 1.0);
  float *out = ref_poisoned(nq), *lse = ref_poisoned((int64_t)B * H * T);
  CHECK_OK(fsdp_attention_forward_docs(out, lse, q, k, v, ds, B, T, H, Hkv, D));
  float *acc = malloc(4 * rq), *accl = malloc(4 * rl), *want = malloc(4 * rq);
  double *wantd = malloc(8 * rq);
  char what[96];
  for (int rank = 0; rank < CP; rank++) {
    for (int i = 0; i < TL; i++) gpos[i] = global_of(CP, C, rank, i);
    for (int src = 0; src < CP; src++) {
      int32_t kpos[TL];
      for (int i = 0; i < TL; i++) kpos[i] = global_of(CP, C, src, i);
      for (int i = 0; i < TL; i++) pos[i] = keys_before(CP, C, src, gpos[i] + 1) - 1;
      for (int b = 0; b < B; b++)
        for (int i = 0; i < TL; i++) lo[b * TL + i] = keys_before(CP, C, src, ds[b * T + gpos[i]]);
      CHECK_OK(fsdp_attention_pos_docs_check(pos, lo, B, TL, TL));
      const dims p = {B, TL, TL, H, Hkv, D, pos, lo};
      inputs x = make_inputs(&p, seed + 7 * (unsigned)(rank * CP + src));
      /* this rank's queries, src's keys and values */
      take_rows(x.q, q, gpos, TL, B, T, H, D), take_rows(x.k, k, kpos, TL, B, T, Hkv, D);
      take_rows(x.v, v, kpos, TL, B, T, Hkv, D);
      for (int64_t e = 0; e < rq; e++) x.qd[e] = x.q[e];
      for (int64_t e = 0; e < rk; e++) x.kd[e] = x.k[e], x.vd[e] = x.v[e];
      snprintf(what, sizeof what, "ring: rank %d, block %d, heads %d/%d, head_dim %d", rank, src, H, Hkv, D);
      results o = check_case(what, &p, &x);
      if (src == 0) memcpy(acc, o.out, 4 * rq), memcpy(accl, o.lse, 4 * rl);
      else CHECK_OK(fsdp_attention_merge(acc, accl, o.out, o.lse, B, TL, H, D));
      free_results(&o), free_inputs(&x);
    }
    /* the merged steps: the _docs op's rows */
    take_rows(want, out, gpos, TL, B, T, H, D);
    for (int64_t e = 0; e < rq; e++) wantd[e] = want[e];
    CHECK(ref_mismatches("merged ring out vs the _docs op's", acc, wantd, rq, 1e-5, 1e-6) == 0);
    for (int b = 0; b < B; b++)
      for (int h = 0; h < H; h++)
        for (int i = 0; i < TL; i++) wantd[((int64_t)b * H + h) * TL + i] = lse[((int64_t)b * H + h) * T + gpos[i]];
    CHECK(ref_mismatches("merged ring lse vs the _docs op's", accl, wantd, rl, 1e-5, 1e-6) == 0);
  }
  free(q), free(k), free(v), free(out), free(lse), free(acc), free(accl), free(want), free(wantd);
}

/* L = sum r * out, float64, for the central differences */
typedef struct {
  const dims *p;
  inputs *x;
} loss_ctx;

static double ref_loss(void *ctx) {
  const loss_ctx *c = ctx;
  const dims *p = c->p;
  const int64_t n = nq_of(p);
  double *o = malloc(sizeof(double) * (size_t)n), L = 0;
  ref_attention_pos_docs(p->B, p->Tq, p->Tk, p->H, p->Hkv, p->D, p->pos, p->lo, c->x->qd, c->x->kd, c->x->vd, c->x->rd,
                         o, NULL, NULL, NULL, NULL);
  for (int64_t i = 0; i < n; i++) L += c->x->rd[i] * o[i];
  free(o);
  return L;
}

/* (e) central differences: rows that see no key amid rows that do */
static void central(void) {
  enum { B = 2, TQ = 6, TK = 8, H = 4, HKV = 2, D = 4 };
  static const int32_t pos[TQ] = {3, 4, 5, 5, 5, 7};
  static const int32_t lo[B * TQ] = {0, 5, 5, 6, 2, 4, /* query 1 (pos 4) and 3 (pos 5) see nothing */
                                     2, 2, 6, 6, 6, 8}; /* queries 2, 3, 4 and 5 see nothing */
  const dims p = {B, TQ, TK, H, HKV, D, pos, lo};
  const int64_t nq = nq_of(&p), nk = nk_of(&p);
  inputs x = make_inputs(&p, 45);
  results o = check_case("central-difference case", &p, &x);
  loss_ctx c = {&p, &x};
  double *cq = malloc(8 * nq), *ck = malloc(8 * nk), *cv = malloc(8 * nk);
  for (int64_t i = 0; i < nq; i++) cq[i] = ref_central(ref_loss, &c, &x.qd[i], 1e-5);
  for (int64_t i = 0; i < nk; i++) ck[i] = ref_central(ref_loss, &c, &x.kd[i], 1e-5);
  for (int64_t i = 0; i < nk; i++) cv[i] = ref_central(ref_loss, &c, &x.vd[i], 1e-5);
  CHECK(ref_mismatches("dq vs central", o.dq, cq, nq, 1e-3, 1e-5) == 0);
  CHECK(ref_mismatches("dk vs central", o.dk, ck, nk, 1e-3, 1e-5) == 0);
  CHECK(ref_mismatches("dv vs central", o.dv, cv, nk, 1e-3, 1e-5) == 0);
  double *aq = malloc(8 * nq), *ak = malloc(8 * nk), *av = malloc(8 * nk), *ao = malloc(8 * nq);
  ref_attention_pos_docs(B, TQ, TK, H, HKV, D, pos, lo, x.qd, x.kd, x.vd, x.rd, ao, NULL, aq, ak, av);
  CHECK(ref_mismatches64("float64 dq vs central", aq, cq, nq, 1e-6, 1e-8) == 0);
  CHECK(ref_mismatches64("float64 dk vs central", ak, ck, nk, 1e-6, 1e-8) == 0);
  CHECK(ref_mismatches64("float64 dv vs central", av, cv, nk, 1e-6, 1e-8) == 0);
  free(cq), free(ck), free(cv), free(aq), free(ak), free(av), free(ao);
  free_results(&o), free_inputs(&x);
}

/* rows that see no key in the middle of 64-row blocks whose other rows do */
static void empty_amid(void) {
  enum { B = 2, TQ = 100, TK = 90 };
  int32_t pos[TQ], lo[B * TQ];
  /* a run rising by one (0 .. 59), then a run of one position (59) */
  for (int i = 0; i < TQ; i++) pos[i] = i < 60 ? i : 59;
  for (int i = 0; i < TQ; i++) {
    /* row 0: a document at 0, one at 20 that query 19 is not in (19 sees
     * nothing), one at 40; in the run at 59: documents after it (60 sees
     * nothing), then from 30 and 50 again (q_lo falls: allowed there) */
    lo[i] = i < 19 ? 0 : i < 40 ? 20 : i < 60 ? 40 : i < 70 ? 60 : i < 85 ? 30 : 50;
    /* row 1: every fifth query sees nothing while its neighbours do */
    lo[TQ + i] = i < 60 ? (i % 5 == 4 ? i + 1 : i - i % 5) : (i % 5 == 0 ? 60 : i % 3 * 20);
  }
  dims p = {B, TQ, TK, 4, 2, 16, pos, lo};
  CHECK_OK(fsdp_attention_pos_docs_check(pos, lo, B, TQ, TK));
  run_case("rows that see nothing amid rows that do", &p, 51);
  p.D = 64;
  run_case("rows that see nothing amid rows that do, head_dim 64", &p, 52);
}

/* no keys (tk 0): every query at -1, q_lo 0; no queries: dk, dv zeros */
static void edges(void) {
  enum { B = 2, TQ = 3, H = 4, HKV = 2, D = 4, NQ = B * TQ * H * D, NL = B * H * TQ };
  const int32_t pos[TQ] = {-1, -1, -1}, lo[B * TQ] = {0};
  float x[NQ] = {0}, *out = ref_poisoned(NQ), *lse = ref_poisoned(NL), *dq = ref_poisoned(NQ);
  CHECK_OK(fsdp_attention_forward_pos_docs(out, lse, x, x, x, pos, lo, B, TQ, 0, H, HKV, D));
  CHECK_OK(fsdp_attention_backward_pos_docs(dq, x, x, x, x, x, x, out, lse, pos, lo, B, TQ, 0, H, HKV, D));
  int ok = 1;
  for (int i = 0; i < NQ; i++) ok &= out[i] == 0 && dq[i] == 0;
  for (int i = 0; i < NL; i++) ok &= lse[i] == -INFINITY;
  CHECK(ok);
  /* no keys: k, v, dk, dv unread, may be NULL */
  float *o2 = ref_poisoned(NQ), *l2 = ref_poisoned(NL), *dq2 = ref_poisoned(NQ);
  CHECK_OK(fsdp_attention_forward_pos_docs(o2, l2, x, NULL, NULL, pos, lo, B, TQ, 0, H, HKV, D));
  CHECK_OK(fsdp_attention_backward_pos_docs(dq2, NULL, NULL, x, x, NULL, NULL, o2, l2, pos, lo, B, TQ, 0, H, HKV, D));
  CHECK(same_bits(o2, out, NQ) && same_bits(l2, lse, NL) && same_bits(dq2, dq, NQ));
  free(o2), free(l2), free(dq2);
  float *dk = ref_poisoned(NQ), *dv = ref_poisoned(NQ);
  CHECK_OK(fsdp_attention_forward_pos_docs(NULL, NULL, NULL, x, x, NULL, NULL, B, 0, 5, H, HKV, D));
  CHECK_OK(fsdp_attention_backward_pos_docs(NULL, dk, dv, NULL, NULL, x, x, NULL, NULL, NULL, NULL, B, 0, 5, H, HKV, D));
  int zero = 1;
  for (int i = 0; i < B * 5 * HKV * D; i++) zero &= dk[i] == 0 && dv[i] == 0;
  CHECK(zero);
  free(out), free(lse), free(dq), free(dk), free(dv);
}

/* (g) refusals, naming the batch row and query */
static void refusals(void) {
  enum { B = 2, TQ = 4, TK = 16, H = 2, HKV = 1, D = 4 };
  static float buf[B * TK * H * D], lse[B * H * TQ];
  int32_t pos[TQ] = {2, 3, 9, 9}, lo[B * TQ] = {0, 1, 4, 10, 3, 3, 0, 0};
  CHECK_OK(fsdp_attention_pos_docs_check(pos, lo, B, TQ, TK));
  CHECK_OK(fsdp_attention_forward_pos_docs(buf, lse, buf, buf, buf, pos, lo, B, TQ, TK, H, HKV, D));
  lo[3] = 11; /* past its position + 1 */
  CHECK_FAILS(fsdp_attention_pos_docs_check(pos, lo, B, TQ, TK), FSDP_EINVAL,
              "q_lo: batch row 0, query 3 (at position 9) holds 11, outside [0, 10]");
  CHECK_FAILS(fsdp_attention_forward_pos_docs(buf, lse, buf, buf, buf, pos, lo, B, TQ, TK, H, HKV, D), FSDP_EINVAL,
              "attention_forward_pos_docs: q_lo: batch row 0, query 3 (at position 9) holds 11");
  CHECK_FAILS(fsdp_attention_backward_pos_docs(buf, buf, buf, buf, buf, buf, buf, buf, lse, pos, lo, B, TQ, TK, H, HKV,
                                               D),
              FSDP_EINVAL, "attention_backward_pos_docs: q_lo: batch row 0, query 3 (at position 9) holds 11");
  lo[3] = 10, lo[5] = -1; /* below 0 */
  CHECK_FAILS(fsdp_attention_forward_pos_docs(buf, lse, buf, buf, buf, pos, lo, B, TQ, TK, H, HKV, D), FSDP_EINVAL,
              "q_lo: batch row 1, query 1 (at position 3) holds -1, outside [0, 4]");
  lo[5] = 2; /* falls within the run 2, 3 */
  CHECK_FAILS(fsdp_attention_forward_pos_docs(buf, lse, buf, buf, buf, pos, lo, B, TQ, TK, H, HKV, D), FSDP_EINVAL,
              "q_lo: batch row 1, query 1 (at position 3) holds 2, below query 0's 3");
  CHECK_FAILS(fsdp_attention_backward_pos_docs(buf, buf, buf, buf, buf, buf, buf, buf, lse, pos, lo, B, TQ, TK, H, HKV,
                                               D),
              FSDP_EINVAL, "attention_backward_pos_docs: q_lo: batch row 1, query 1 (at position 3) holds 2, below");
  lo[5] = 3, lo[7] = 0, pos[0] = -1; /* q_pos -1: q_lo must be 0 */
  lo[0] = 1;
  CHECK_FAILS(fsdp_attention_pos_docs_check(pos, lo, B, TQ, TK), FSDP_EINVAL,
              "q_lo: batch row 0, query 0 (at position -1) holds 1, outside [0, 0]");
  lo[0] = 0, pos[0] = 2, pos[2] = TK;
  CHECK_FAILS(fsdp_attention_forward_pos_docs(buf, lse, buf, buf, buf, pos, lo, B, TQ, TK, H, HKV, D), FSDP_EINVAL,
              "attention_forward_pos_docs: q_pos: query 2 at position 16, outside [-1, 16)");
  pos[2] = 9;
  CHECK_FAILS(fsdp_attention_forward_pos_docs(buf, lse, buf, buf, buf, pos, NULL, B, TQ, TK, H, HKV, D), FSDP_EINVAL,
              "attention_forward_pos_docs: q_lo is NULL");
  CHECK_FAILS(fsdp_attention_backward_pos_docs(buf, buf, buf, buf, buf, buf, buf, buf, lse, pos, NULL, B, TQ, TK, H, HKV,
                                               D),
              FSDP_EINVAL, "attention_backward_pos_docs: q_lo is NULL");
  CHECK_FAILS(fsdp_attention_forward_pos_docs(buf, lse, buf, buf, buf, NULL, lo, B, TQ, TK, H, HKV, D), FSDP_EINVAL,
              "attention_forward_pos_docs: q_pos is NULL");
  CHECK_FAILS(fsdp_attention_pos_docs_check(pos, NULL, B, TQ, TK), FSDP_EINVAL, "q_lo: batch=2, 4 queries");
  CHECK_FAILS(fsdp_attention_forward_pos_docs(buf, NULL, buf, buf, buf, pos, lo, B, TQ, TK, H, HKV, D), FSDP_EINVAL,
              "NULL buffer");
  CHECK_FAILS(fsdp_attention_forward_pos_docs(buf, lse, buf, buf, buf, pos, lo, B, TQ, TK, 3, 2, D), FSDP_EINVAL,
              "multiple of kv_heads");
}

int main(void) {
  CHECK_OK(fsdp_cpu_threads_set(3)); /* the heads shared among threads */
  { /* (a) q_lo all 0: rank 0 of cp 2 (T 260), ring steps' runs and rows at -1 */
    int32_t pos[140];
    for (int i = 0; i < 65; i++) pos[i] = i, pos[65 + i] = 195 + i;
    same_as_pos("q_lo 0: cp 2 rank 0", 2, 130, 260, 6, 2, 16, pos, 41);
    for (int i = 0; i < 140; i++) pos[i] = i < 70 ? -1 : i < 100 ? 69 : 139;
    same_as_pos("q_lo 0: ring steps", 2, 140, 140, 4, 2, 8, pos, 42);
    const int32_t mixed[12] = {-1, -1, 3, 3, 4, 5, 5, 5, -1, 0, 0, 9};
    same_as_pos("q_lo 0: mixed runs", 2, 12, 10, 4, 2, 8, mixed, 43);
  }
  ring_layout(4, 2, 16, 44); /* (b, c, d) */
  ring_layout(4, 2, 64, 45);
  ring_layout(4, 4, 16, 46); /* MHA */
  empty_amid();
  central(); /* (e) */
  edges();
  refusals(); /* (g) */
  return fsdp_test_summary("attention_pos_docs");
}
