/* ref_attention.c: the float64 attention the attention tests hold the ops
 * to (ref.h): softmax(q k^T / sqrt(D)) v with grouped-query heads, query i
 * over keys ds[i] .. i (ds NULL: 0 .. i, causal), and d(sum r * out) /
 * d(q, k, v) by the chain rule. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"

void ref_attention(int B, int T, int H, int Hkv, int D, const int32_t *ds, const double *q, const double *k,
                   const double *v, const double *r, double *out, double *gq, double *gk, double *gv) {
  const int G = H / Hkv;
  double *pr = malloc(sizeof(double) * (size_t)T), *dp = malloc(sizeof(double) * (size_t)T), sc = 1 / sqrt((double)D);
  if (gq) {
    memset(gq, 0, sizeof(double) * (size_t)B * T * H * D);
    memset(gk, 0, sizeof(double) * (size_t)B * T * Hkv * D);
    memset(gv, 0, sizeof(double) * (size_t)B * T * Hkv * D);
  }
#define Q(i) (((b * T + (i)) * H + h) * D)
#define K(j) (((b * T + (j)) * Hkv + h / G) * D)
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < T; i++) {
        const int j0 = ds ? ds[b * T + i] : 0;
        double m = -INFINITY, z = 0, di = 0;
        for (int j = j0; j <= i; j++) {
          double dot = 0;
          for (int c = 0; c < D; c++) dot += q[Q(i) + c] * k[K(j) + c];
          pr[j] = dot * sc;
          m = pr[j] > m ? pr[j] : m;
        }
        for (int j = j0; j <= i; j++) z += (pr[j] = exp(pr[j] - m));
        for (int j = j0; j <= i; j++) pr[j] /= z;
        for (int c = 0; c < D; c++) {
          double o = 0;
          for (int j = j0; j <= i; j++) o += pr[j] * v[K(j) + c];
          out[Q(i) + c] = o;
        }
        if (!gq) continue;
        for (int j = j0; j <= i; j++) {
          dp[j] = 0;
          for (int c = 0; c < D; c++) dp[j] += r[Q(i) + c] * v[K(j) + c];
          di += pr[j] * dp[j];
        }
        for (int j = j0; j <= i; j++) {
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
