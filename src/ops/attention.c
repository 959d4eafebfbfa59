/* attention.c: causal scaled-dot-product attention with grouped-query
 * heads, on CPU through OpenBLAS. Query head h reads kv head h / (H / Hkv)
 * (Hugging Face's repeat_kv). Layouts are those the projections produce,
 * no transposes: q, out [B, T, H, D]; k, v [B, T, Hkv, D]; the strided
 * head slices go straight to sgemm as leading dimensions.
 *
 * Forward per (batch, head): S = scale Q K^T, a causal softmax row by row
 * (row i sees columns 0..i), O = P V; the log-sum-exp of each row is saved.
 * Backward recomputes P from it (flash-attention style: nothing [T, T] is
 * kept between forward and backward):
 *   dP = dO V^T,  dS = P (dP - rowsum(dO * O)),  dQ = scale dS K,
 *   dK += scale dS^T Q,  dV += P^T dO   (summed over the heads of a group).
 * Scratch: two [T, T] fp32 blocks per call. The full T x T product is
 * computed and its upper half discarded: simpler than blocking, and the
 * GEMM is still the cost. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"

static int check_dims(const char *op, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  if (B < 0 || T < 0 || H < 1 || Hkv < 1 || D < 1 || H % Hkv || T > INT32_MAX / 2 || H * D > INT32_MAX)
    return fsdp_fail(FSDP_EINVAL, "%s: batch=%lld seq=%lld heads=%lld kv_heads=%lld head_dim=%lld (heads must be a multiple "
                     "of kv_heads)", op, (long long)B, (long long)T, (long long)H, (long long)Hkv, (long long)D);
  return FSDP_OK;
}

int fsdp_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int64_t B, int64_t T,
                           int64_t H, int64_t Hkv, int64_t D) {
  FSDP_CHECK(check_dims("attention_forward", B, T, H, Hkv, D));
  if (!B || !T) return FSDP_OK;
  if (!out || !lse || !q || !k || !v) return fsdp_fail(FSDP_EINVAL, "attention_forward: NULL buffer");
  float *S = malloc(sizeof(float) * (size_t)T * (size_t)T);
  if (!S) return fsdp_fail(FSDP_ENOMEM, "attention_forward: no memory for a %lld x %lld score block", (long long)T, (long long)T);
  const float scale = 1.0f / sqrtf((float)D);
  const int64_t G = H / Hkv, ldq = H * D, ldk = Hkv * D;
  const int t = (int)T, d = (int)D;
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++) {
      const float *qh = q + b * T * ldq + h * D, *kh = k + b * T * ldk + (h / G) * D, *vh = v + b * T * ldk + (h / G) * D;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, d, scale, qh, (int)ldq, kh, (int)ldk, 0.0f, S, t);
      float *L = lse + (b * H + h) * T;
      for (int64_t i = 0; i < T; i++) {
        float *row = S + i * T, m = row[0];
        for (int64_t j = 1; j <= i; j++) m = row[j] > m ? row[j] : m;
        double s = 0;
        for (int64_t j = 0; j <= i; j++) {
          row[j] = expf(row[j] - m);
          s += row[j];
        }
        float inv = (float)(1.0 / s);
        for (int64_t j = 0; j <= i; j++) row[j] *= inv;
        for (int64_t j = i + 1; j < T; j++) row[j] = 0;
        L[i] = m + (float)log(s);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t, d, t, 1.0f, S, t, vh, (int)ldk, 0.0f,
                  out + b * T * ldq + h * D, (int)ldq);
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
  float *P = malloc(sizeof(float) * (size_t)T * (size_t)T * 2);
  if (!P) return fsdp_fail(FSDP_ENOMEM, "attention_backward: no memory for two %lld x %lld blocks", (long long)T, (long long)T);
  float *dP = P + T * T;
  const float scale = 1.0f / sqrtf((float)D);
  const int64_t G = H / Hkv, ldq = H * D, ldk = Hkv * D;
  const int t = (int)T, d = (int)D;
  memset(dk, 0, sizeof(float) * (size_t)(B * T * ldk));
  memset(dv, 0, sizeof(float) * (size_t)(B * T * ldk));
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++) {
      int64_t qo = b * T * ldq + h * D, ko = b * T * ldk + (h / G) * D;
      const float *qh = q + qo, *kh = k + ko, *vh = v + ko, *doh = dout + qo, *oh = out + qo;
      const float *L = lse + (b * H + h) * T;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, d, scale, qh, (int)ldq, kh, (int)ldk, 0.0f, P, t);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, d, 1.0f, doh, (int)ldq, vh, (int)ldk, 0.0f, dP, t);
      for (int64_t i = 0; i < T; i++) {
        float *p = P + i * T, *dp = dP + i * T;
        double di = 0; /* rowsum(dO * O) = sum_j P_ij dP_ij */
        for (int64_t c = 0; c < D; c++) di += (double)doh[i * ldq + c] * oh[i * ldq + c];
        for (int64_t j = 0; j <= i; j++) {
          p[j] = expf(p[j] - L[i]);
          dp[j] = p[j] * (dp[j] - (float)di);
        }
        for (int64_t j = i + 1; j < T; j++) p[j] = dp[j] = 0;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t, d, t, scale, dP, t, kh, (int)ldk, 0.0f, dq + qo, (int)ldq);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t, d, t, scale, dP, t, qh, (int)ldq, 1.0f, dk + ko, (int)ldk);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t, d, t, 1.0f, P, t, doh, (int)ldq, 1.0f, dv + ko, (int)ldk);
    }
  free(P);
  return FSDP_OK;
}
