/* ref_attention.c: the float64 attention the attention tests hold the ops
 * to (ref.h): softmax(q k^T / sqrt(D)) v with grouped-query heads, query i
 * over keys ds[i] .. i (ds NULL: 0 .. i, causal), or over keys 0 ..
 * q_pos[i] (queries at given positions; none at -1: out 0, lse -inf), or
 * over keys q_lo[i] .. q_pos[i] (both; none where q_lo = q_pos + 1), the
 * log-sum-exp of each row's scores, and d(sum r * out) / d(q, k, v) by the
 * chain rule. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"

/* Tq queries, Tk keys; query i sees keys lo .. e: lo = ds[b, i] or 0, e = q_pos[i] or i (none if e < lo); lse [B, H,
 * Tq] or NULL */
static void attention(int B, int Tq, int Tk, int H, int Hkv, int D, const int32_t *ds, const int32_t *q_pos,
                      const double *q, const double *k, const double *v, const double *r, double *out, double *lse,
                      double *gq, double *gk, double *gv) {
  const int G = H / Hkv;
  double *pr = malloc(sizeof(double) * (size_t)Tk), *dp = malloc(sizeof(double) * (size_t)Tk), sc = 1 / sqrt((double)D);
  if (gq) {
    memset(gq, 0, sizeof(double) * (size_t)B * Tq * H * D);
    memset(gk, 0, sizeof(double) * (size_t)B * Tk * Hkv * D);
    memset(gv, 0, sizeof(double) * (size_t)B * Tk * Hkv * D);
  }
#define Q(i) (((b * Tq + (i)) * H + h) * D)
#define K(j) (((b * Tk + (j)) * Hkv + h / G) * D)
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < Tq; i++) {
        const int j0 = ds ? ds[b * Tq + i] : 0, e = q_pos ? q_pos[i] : i;
        double m = -INFINITY, z = 0, di = 0;
        for (int j = j0; j <= e; j++) {
          double dot = 0;
          for (int c = 0; c < D; c++) dot += q[Q(i) + c] * k[K(j) + c];
          pr[j] = dot * sc;
          m = pr[j] > m ? pr[j] : m;
        }
        for (int j = j0; j <= e; j++) z += (pr[j] = exp(pr[j] - m));
        if (lse) lse[((int64_t)b * H + h) * Tq + i] = e < j0 ? -INFINITY : m + log(z);
        for (int j = j0; j <= e; j++) pr[j] /= z;
        for (int c = 0; c < D; c++) {
          double o = 0;
          for (int j = j0; j <= e; j++) o += pr[j] * v[K(j) + c];
          out[Q(i) + c] = o;
        }
        if (!gq) continue;
        for (int j = j0; j <= e; j++) {
          dp[j] = 0;
          for (int c = 0; c < D; c++) dp[j] += r[Q(i) + c] * v[K(j) + c];
          di += pr[j] * dp[j];
        }
        for (int j = j0; j <= e; j++) {
          double g = pr[j] * (dp[j] - di) * sc;
          for (int c = 0; c < D; c++) {
            gq[Q(i) + c] += g * k[K(j) + c];
            gk[K(j) + c] += g * q[Q(i) + c];
            gv[K(j) + c] += pr[j] * r[Q(i) + c];
          }
        }
      }
#undef Q
#undef K
  free(pr), free(dp);
}

void ref_attention(int B, int T, int H, int Hkv, int D, const int32_t *ds, const double *q, const double *k,
                   const double *v, const double *r, double *out, double *gq, double *gk, double *gv) {
  attention(B, T, T, H, Hkv, D, ds, NULL, q, k, v, r, out, NULL, gq, gk, gv);
}

void ref_attention_pos(int B, int Tq, int Tk, int H, int Hkv, int D, const int32_t *q_pos, const double *q,
                       const double *k, const double *v, const double *r, double *out, double *gq, double *gk,
                       double *gv) {
  attention(B, Tq, Tk, H, Hkv, D, NULL, q_pos, q, k, v, r, out, NULL, gq, gk, gv);
}

void ref_attention_pos_lse(int B, int Tq, int Tk, int H, int Hkv, int D, const int32_t *q_pos, const double *q,
                           const double *k, const double *v, const double *r, double *out, double *lse, double *gq,
                           double *gk, double *gv) {
  attention(B, Tq, Tk, H, Hkv, D, NULL, q_pos, q, k, v, r, out, lse, gq, gk, gv);
}

void ref_attention_pos_docs(int B, int Tq, int Tk, int H, int Hkv, int D, const int32_t *q_pos, const int32_t *q_lo,
                            const double *q, const double *k, const double *v, const double *r, double *out, double *lse,
                            double *gq, double *gk, double *gv) {
  attention(B, Tq, Tk, H, Hkv, D, q_lo, q_pos, q, k, v, r, out, lse, gq, gk, gv);
}
