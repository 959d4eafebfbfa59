/* test_attention: causal GQA attention against a float64 reference.
 * Forward within 1e-5 relative + 1e-6 absolute; backward (dq, dk, dv)
 * within 1e-3 relative + 1e-5 absolute of central differences (h = 1e-5)
 * of L = sum r * out computed in float64, and of the float64 analytic
 * backward (which itself matches the central differences within 1e-6
 * relative + 1e-8); sequences longer than the op's block of query rows
 * (T = 150, 200: full and partial blocks) against the analytic backward
 * only, within 1e-4 relative + 1e-5; groups whose query heads fill more
 * than one stack of GEMM rows, the last one partial, the same way. Also: causality (a change at the last
 * position leaves earlier outputs bit-identical), GQA equal to MHA with the
 * kv heads repeated (1e-6), bad shapes rejected. The heads are shared
 * among CPU threads: every check runs with 3 of them, and one shape's
 * outputs and grads (groups of 6 heads: two stacks) must be bit-identical
 * with 1, 2, 3 and 5 threads. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ref.h"

typedef struct {
  int B, T, H, Hkv, D;
  double *q, *k, *v, *r;
} prob;

static void ref_forward(const prob *p, double *out) {
  ref_attention(p->B, p->T, p->H, p->Hkv, p->D, NULL, p->q, p->k, p->v, p->r, out, NULL, NULL, NULL);
}

/* d(sum r * out) / d(q, k, v), float64, by the chain rule */
static void ref_backward(const prob *p, double *gq, double *gk, double *gv) {
  double *out = malloc(sizeof(double) * (size_t)p->B * p->T * p->H * p->D);
  ref_attention(p->B, p->T, p->H, p->Hkv, p->D, NULL, p->q, p->k, p->v, p->r, out, gq, gk, gv);
  free(out);
}

static double ref_loss(void *ctx) {
  prob *p = ctx;
  int64_t n = (int64_t)p->B * p->T * p->H * p->D;
  double *o = malloc(sizeof(double) * (size_t)n), L = 0;
  ref_forward(p, o);
  for (int64_t i = 0; i < n; i++) L += p->r[i] * o[i];
  free(o);
  return L;
}

/* central: also against central differences (small shapes: each costs two forwards per input) */
static void run(int B, int T, int H, int Hkv, int D, unsigned seed, int central) {
  int64_t nq = (int64_t)B * T * H * D, nk = (int64_t)B * T * Hkv * D;
  prob p = {B, T, H, Hkv, D, malloc(8 * nq), malloc(8 * nk), malloc(8 * nk), malloc(8 * nq)};
  float *q = malloc(4 * nq), *k = malloc(4 * nk), *v = malloc(4 * nk), *r = malloc(4 * nq);
  ref_fill(q, p.q, nq, &seed, 1.5);
  ref_fill(k, p.k, nk, &seed, 1.5);
  ref_fill(v, p.v, nk, &seed, 1.0);
  ref_fill(r, p.r, nq, &seed, 1.0);
  float *out = ref_poisoned(nq), *lse = ref_poisoned((int64_t)B * H * T);
  float *dq = ref_poisoned(nq), *dk = ref_poisoned(nk), *dv = ref_poisoned(nk);
  CHECK_OK(fsdp_attention_forward(out, lse, q, k, v, B, T, H, Hkv, D));
  double *want = malloc(8 * nq);
  ref_forward(&p, want);
  CHECK(ref_mismatches("attention out", out, want, nq, 1e-5, 1e-6) == 0);
  CHECK_OK(fsdp_attention_backward(dq, dk, dv, r, q, k, v, out, lse, B, T, H, Hkv, D));
  double *gq = malloc(8 * nq), *gk = malloc(8 * nk), *gv = malloc(8 * nk);
  double *aq = malloc(8 * nq), *ak = malloc(8 * nk), *av = malloc(8 * nk);
  ref_backward(&p, aq, ak, av);
  if (central) {
    for (int64_t i = 0; i < nq; i++) gq[i] = ref_central(ref_loss, &p, &p.q[i], 1e-5);
    for (int64_t i = 0; i < nk; i++) gk[i] = ref_central(ref_loss, &p, &p.k[i], 1e-5);
    for (int64_t i = 0; i < nk; i++) gv[i] = ref_central(ref_loss, &p, &p.v[i], 1e-5);
    CHECK(ref_mismatches("dq", dq, gq, nq, 1e-3, 1e-5) == 0);
    CHECK(ref_mismatches("dk", dk, gk, nk, 1e-3, 1e-5) == 0);
    CHECK(ref_mismatches("dv", dv, gv, nk, 1e-3, 1e-5) == 0);
    /* the analytic reference, checked once here, stands in for the long sequences */
    CHECK(ref_mismatches64("analytic dq", aq, gq, nq, 1e-6, 1e-8) == 0);
    CHECK(ref_mismatches64("analytic dk", ak, gk, nk, 1e-6, 1e-8) == 0);
    CHECK(ref_mismatches64("analytic dv", av, gv, nk, 1e-6, 1e-8) == 0);
  }
  CHECK(ref_mismatches("dq vs analytic", dq, aq, nq, 1e-4, 1e-5) == 0);
  CHECK(ref_mismatches("dk vs analytic", dk, ak, nk, 1e-4, 1e-5) == 0);
  CHECK(ref_mismatches("dv vs analytic", dv, av, nk, 1e-4, 1e-5) == 0);
  /* causality: a new k, v at the last position changes nothing before it */
  if (T > 1) {
    float *out2 = ref_poisoned(nq);
    for (int b = 0; b < B; b++)
      for (int c = 0; c < Hkv * D; c++) k[((b * T + T - 1) * Hkv) * D + c] += 0.5f, v[((b * T + T - 1) * Hkv) * D + c] -= 0.5f;
    CHECK_OK(fsdp_attention_forward(out2, lse, q, k, v, B, T, H, Hkv, D));
    int same = 1;
    for (int b = 0; b < B; b++)
      same &= memcmp(out + (int64_t)b * T * H * D, out2 + (int64_t)b * T * H * D, sizeof(float) * (size_t)(T - 1) * H * D) == 0;
    CHECK(same);
    free(out2);
  }
  free(p.q), free(p.k), free(p.v), free(p.r), free(q), free(k), free(v), free(r), free(out), free(lse);
  free(dq), free(dk), free(dv), free(want), free(gq), free(gk), free(gv), free(aq), free(ak), free(av);
}

/* GQA = MHA over the kv heads repeated, as HF's repeat_kv does */
static void gqa_is_repeat(void) {
  enum { B = 2, T = 9, H = 6, Hkv = 2, D = 8, G = H / Hkv };
  unsigned seed = 99;
  static float q[B * T * H * D], k[B * T * Hkv * D], v[B * T * Hkv * D], kr[B * T * H * D], vr[B * T * H * D];
  static float o1[B * T * H * D], o2[B * T * H * D], l1[B * H * T], l2[B * H * T];
  ref_fill(q, NULL, B * T * H * D, &seed, 1);
  ref_fill(k, NULL, B * T * Hkv * D, &seed, 1);
  ref_fill(v, NULL, B * T * Hkv * D, &seed, 1);
  for (int bt = 0; bt < B * T; bt++)
    for (int h = 0; h < H; h++)
      for (int c = 0; c < D; c++) {
        kr[(bt * H + h) * D + c] = k[(bt * Hkv + h / G) * D + c];
        vr[(bt * H + h) * D + c] = v[(bt * Hkv + h / G) * D + c];
      }
  CHECK_OK(fsdp_attention_forward(o1, l1, q, k, v, B, T, H, Hkv, D));
  CHECK_OK(fsdp_attention_forward(o2, l2, q, kr, vr, B, T, H, H, D));
  double want[B * T * H * D];
  for (int i = 0; i < B * T * H * D; i++) want[i] = o2[i];
  CHECK(ref_mismatches("gqa vs repeated", o1, want, B * T * H * D, 1e-6, 1e-7) == 0);
}

/* forward and backward with `threads` CPU threads, into out .. dv */
static void with_threads(int threads, const float *q, const float *k, const float *v, const float *r, float *out,
                         float *lse, float *dq, float *dk, float *dv, int B, int T, int H, int Hkv, int D) {
  CHECK_OK(fsdp_cpu_threads_set(threads));
  CHECK_OK(fsdp_attention_forward(out, lse, q, k, v, B, T, H, Hkv, D));
  CHECK_OK(fsdp_attention_backward(dq, dk, dv, r, q, k, v, out, lse, B, T, H, Hkv, D));
}

/* the same bits for any thread count: each head computes as it would alone
 * (threads that take a share of the heads, or GEMMs that take threads) */
static void same_bits_any_threads(void) {
  enum { B = 3, T = 130, H = 12, Hkv = 2, D = 16, NQ = B * T * H * D, NK = B * T * Hkv * D };
  unsigned seed = 17;
  float *q = malloc(4 * NQ), *k = malloc(4 * NK), *v = malloc(4 * NK), *r = malloc(4 * NQ);
  ref_fill(q, NULL, NQ, &seed, 1.5);
  ref_fill(k, NULL, NK, &seed, 1.5);
  ref_fill(v, NULL, NK, &seed, 1.0);
  ref_fill(r, NULL, NQ, &seed, 1.0);
  float *o1 = ref_poisoned(NQ), *l1 = ref_poisoned(B * H * T), *q1 = ref_poisoned(NQ), *k1 = ref_poisoned(NK),
        *v1 = ref_poisoned(NK);
  with_threads(1, q, k, v, r, o1, l1, q1, k1, v1, B, T, H, Hkv, D);
  static const int counts[] = {2, 3, 5};
  for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
    float *o = ref_poisoned(NQ), *l = ref_poisoned(B * H * T), *gq = ref_poisoned(NQ), *gk = ref_poisoned(NK),
          *gv = ref_poisoned(NK);
    with_threads(counts[c], q, k, v, r, o, l, gq, gk, gv, B, T, H, Hkv, D);
    CHECK(memcmp(o, o1, 4 * NQ) == 0 && memcmp(l, l1, 4 * B * H * T) == 0);
    CHECK(memcmp(gq, q1, 4 * NQ) == 0 && memcmp(gk, k1, 4 * NK) == 0 && memcmp(gv, v1, 4 * NK) == 0);
    free(o), free(l), free(gq), free(gk), free(gv);
  }
  free(q), free(k), free(v), free(r), free(o1), free(l1), free(q1), free(k1), free(v1);
}

int main(void) {
  same_bits_any_threads();
  CHECK_OK(fsdp_cpu_threads_set(3)); /* the reference checks with the heads shared among threads */
  run(1, 1, 1, 1, 4, 1, 1);
  run(2, 5, 4, 2, 6, 2, 1);
  run(1, 7, 6, 3, 8, 3, 1);
  run(2, 4, 3, 1, 5, 4, 1);
  run(1, 16, 2, 2, 4, 5, 1);
  run(1, 150, 4, 2, 8, 6, 0); /* blocks of query rows: full and partial */
  run(2, 200, 2, 1, 5, 7, 0);
  run(1, 130, 6, 1, 4, 8, 0);  /* a group of 6 heads in stacks of 4 and 2 (64-row blocks) */
  run(2, 9, 40, 1, 3, 9, 0);   /* 40 heads of 9 rows: stacks of 28 and 12 */
  gqa_is_repeat();
  float x = 0;
  CHECK_FAILS(fsdp_attention_forward(&x, &x, &x, &x, &x, 1, 1, 4, 3, 2), FSDP_EINVAL, "multiple of kv_heads");
  CHECK_FAILS(fsdp_attention_forward(NULL, &x, &x, &x, &x, 1, 1, 1, 1, 2), FSDP_EINVAL, "NULL");
  return fsdp_test_summary("test_attention");
}
