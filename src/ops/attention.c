/* attention.c: causal scaled-dot-product attention with grouped-query
 * heads, on CPU through OpenBLAS. Query head h reads kv head h / (H / Hkv)
 * (Hugging Face's repeat_kv). Layouts are those the projections produce,
 * no transposes: q, out [B, T, H, D]; k, v [B, T, Hkv, D]; the strided
 * head slices go straight to sgemm as leading dimensions.
 *
 * Forward per (batch, head): S = scale Q K^T, a causal softmax row by row
 * (row i sees columns 0..i; fp32, the vectorised loops of rows.c: one
 * exponential per score, the row's sum applied to O's row), O = P V; the
 * log-sum-exp of each row is saved.
 * Backward recomputes P from it (flash-attention style: nothing [T, T] is
 * kept between forward and backward):
 *   dP = dO V^T,  dS = P (dP - rowsum(dO * O)),  dQ = scale dS K,
 *   dK += scale dS^T Q,  dV += P^T dO   (summed over the heads of a group).
 * Only the causal half is computed: the query rows go in blocks of BLOCK,
 * and block [i0, i1) multiplies with keys 0 .. i1 - 1 alone, so the GEMMs
 * do about T^2 / 2 + T BLOCK / 2 of the T^2 score products (0.53x at
 * T = 1024, 0.75x at T = 128), and the scratch is [BLOCK, T] per block
 * instead of [T, T]. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "../fsdp_ops.h"
#include "ops.h"
#include "rows.h"

static int check_dims(const char *op, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  if (B < 0 || T < 0 || H < 1 || Hkv < 1 || D < 1 || H % Hkv || T > INT32_MAX / 2 || H * D > INT32_MAX)
    return fsdp_fail(FSDP_EINVAL, "%s: batch=%lld seq=%lld heads=%lld kv_heads=%lld head_dim=%lld (heads must be a multiple "
                     "of kv_heads)", op, (long long)B, (long long)T, (long long)H, (long long)Hkv, (long long)D);
  return FSDP_OK;
}

/* query rows per block: measured (bench/RESULTS.md); smaller blocks skip
 * more of the upper half but make GEMMs too thin to run at speed */
enum { BLOCK = 64 };

int fsdp_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int64_t B, int64_t T,
                           int64_t H, int64_t Hkv, int64_t D) {
  FSDP_CHECK(check_dims("attention_forward", B, T, H, Hkv, D));
  if (!B || !T) return FSDP_OK;
  if (!out || !lse || !q || !k || !v) return fsdp_fail(FSDP_EINVAL, "attention_forward: NULL buffer");
  const int64_t rows = T < BLOCK ? T : BLOCK;
  float *S = malloc(sizeof(float) * (size_t)rows * (size_t)(T + 1));
  if (!S) return fsdp_fail(FSDP_ENOMEM, "attention_forward: no memory for a %lld x %lld score block", (long long)rows, (long long)T);
  float *inv = S + rows * T; /* 1 / each row's sum */
  const float scale = 1.0f / sqrtf((float)D);
  const int64_t G = H / Hkv, ldq = H * D, ldk = Hkv * D;
  const int d = (int)D;
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++) {
      const float *qh = q + b * T * ldq + h * D, *kh = k + b * T * ldk + (h / G) * D, *vh = v + b * T * ldk + (h / G) * D;
      float *L = lse + (b * H + h) * T;
      for (int64_t i0 = 0; i0 < T; i0 += BLOCK) {
        const int64_t i1 = i0 + BLOCK < T ? i0 + BLOCK : T; /* rows i0 .. i1 - 1 see keys 0 .. i1 - 1 */
        const int bq = (int)(i1 - i0), n = (int)i1;
        fsdp_sgemm(0, 1, bq, n, d, scale, qh + i0 * ldq, ldq, kh, ldk, 0.0f, S, n);
        for (int64_t i = i0; i < i1; i++) { /* e^(S_ij - max_i) for j <= i, else 0; their sum */
          float *row = S + (i - i0) * n;
          const float m = fsdp_row_max(row, i + 1), sum = fsdp_row_exp_sum(row, i + 1, m);
          L[i] = m + logf(sum);
          inv[i - i0] = 1.0f / sum;
          memset(row + i + 1, 0, sizeof(float) * (size_t)(n - i - 1));
        }
        /* O = P V with P's rows normalised after the product: D values a
         * row instead of i + 1 */
        float *oh = out + b * T * ldq + i0 * ldq + h * D;
        fsdp_sgemm(0, 0, bq, d, n, 1.0f, S, n, vh, ldk, 0.0f, oh, ldq);
        for (int64_t i = 0; i < bq; i++) fsdp_row_scale(oh + i * ldq, D, inv[i]);
      }
    }
  free(S);
  return FSDP_OK;
}

int fsdp_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                            const float *v, const float *out, const float *lse, int64_t B, int64_t T, int64_t H,
                            int64_t Hkv, int64_t D) {
  FSDP_CHECK(check_dims("attention_backward", B, T, H, Hkv, D));
  if (!B || !T) return FSDP_OK;
  if (!dq || !dk || !dv || !dout || !q || !k || !v || !out || !lse)
    return fsdp_fail(FSDP_EINVAL, "attention_backward: NULL buffer");
  const int64_t rows = T < BLOCK ? T : BLOCK;
  float *P = malloc(sizeof(float) * (size_t)rows * (size_t)T * 2);
  if (!P)
    return fsdp_fail(FSDP_ENOMEM, "attention_backward: no memory for two %lld x %lld blocks", (long long)rows, (long long)T);
  float *dP = P + rows * T;
  const float scale = 1.0f / sqrtf((float)D);
  const int64_t G = H / Hkv, ldq = H * D, ldk = Hkv * D;
  const int d = (int)D;
  memset(dk, 0, sizeof(float) * (size_t)(B * T * ldk));
  memset(dv, 0, sizeof(float) * (size_t)(B * T * ldk));
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++) {
      const int64_t qo = b * T * ldq + h * D, ko = b * T * ldk + (h / G) * D;
      const float *qh = q + qo, *kh = k + ko, *vh = v + ko, *doh = dout + qo, *oh = out + qo;
      const float *L = lse + (b * H + h) * T;
      for (int64_t i0 = 0; i0 < T; i0 += BLOCK) {
        const int64_t i1 = i0 + BLOCK < T ? i0 + BLOCK : T, bo = i0 * ldq;
        const int bq = (int)(i1 - i0), n = (int)i1;
        fsdp_sgemm(0, 1, bq, n, d, scale, qh + bo, ldq, kh, ldk, 0.0f, P, n);
        fsdp_sgemm(0, 1, bq, n, d, 1.0f, doh + bo, ldq, vh, ldk, 0.0f, dP, n);
        for (int64_t i = i0; i < i1; i++) {
          float *p = P + (i - i0) * n, *dp = dP + (i - i0) * n;
          double di = 0; /* rowsum(dO * O) = sum_j P_ij dP_ij */
          for (int64_t c = 0; c < D; c++) di += (double)doh[i * ldq + c] * oh[i * ldq + c];
          fsdp_row_exp_scaled(p, i + 1, L[i], 1.0f);
          fsdp_row_softmax_grad(dp, p, i + 1, (float)di);
          memset(p + i + 1, 0, sizeof(float) * (size_t)(n - i - 1));
          memset(dp + i + 1, 0, sizeof(float) * (size_t)(n - i - 1));
        }
        /* dQ rows i0 .. i1 - 1; dK, dV rows 0 .. i1 - 1 gather this block's share */
        fsdp_sgemm(0, 0, bq, d, n, scale, dP, n, kh, ldk, 0.0f, dq + qo + bo, ldq);
        fsdp_sgemm(1, 0, n, d, bq, scale, dP, n, qh + bo, ldq, 1.0f, dk + ko, ldk);
        fsdp_sgemm(1, 0, n, d, bq, 1.0f, P, n, doh + bo, ldq, 1.0f, dv + ko, ldk);
      }
    }
  free(P);
  return FSDP_OK;
}
