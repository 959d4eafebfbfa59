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
 * instead of [T, T].
 * Threads: the forward's (batch, head) pairs, and the backward's (batch,
 * kv head) groups (a group's query heads sum into the same dK, dV rows),
 * are shared among the rank's CPU threads, each GEMM then on one thread
 * (fsdp_parallel_gemms); each pair computes as it would alone on one
 * thread, so the bits are the same for any number of threads sharing the
 * heads (a run whose heads stay on one thread, their GEMMs threaded, may
 * differ in the last bits: OpenBLAS's threads split a GEMM otherwise). */
#include <math.h>
#include <stdatomic.h>
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

/* rows of a score block: a whole block, or all of a shorter sequence */
static int64_t block_rows(int64_t T) { return T < BLOCK ? T : BLOCK; }

/* one call's shapes and buffers, shared by the threads that take its heads */
typedef struct attn_job {
  float *out, *lse_out, *dq, *dk, *dv;
  const float *q, *k, *v, *dout, *o, *lse;
  int64_t B, T, H, Hkv, D;
  atomic_int no_memory; /* a thread found no memory for its scratch */
} attn_job;

/* forward of heads lo .. hi - 1 (item = b * H + h) */
static void forward_heads(void *arg, int64_t lo, int64_t hi) {
  attn_job *j = arg;
  const int64_t T = j->T, H = j->H, D = j->D, rows = block_rows(T);
  float *S = malloc(sizeof(float) * (size_t)rows * (size_t)(T + 1));
  if (!S) {
    atomic_store(&j->no_memory, 1);
    return;
  }
  float *inv = S + rows * T; /* 1 / each row's sum */
  const float scale = 1.0f / sqrtf((float)D);
  const int64_t G = H / j->Hkv, ldq = H * D, ldk = j->Hkv * D;
  const int d = (int)D;
  for (int64_t item = lo; item < hi; item++) {
    const int64_t b = item / H, h = item % H;
    const float *qh = j->q + b * T * ldq + h * D, *kh = j->k + b * T * ldk + (h / G) * D,
                *vh = j->v + b * T * ldk + (h / G) * D;
    float *L = j->lse_out + (b * H + h) * T;
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
      float *oh = j->out + b * T * ldq + i0 * ldq + h * D;
      fsdp_sgemm(0, 0, bq, d, n, 1.0f, S, n, vh, ldk, 0.0f, oh, ldq);
      for (int64_t i = 0; i < bq; i++) fsdp_row_scale(oh + i * ldq, D, inv[i]);
    }
  }
  free(S);
}

int fsdp_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int64_t B, int64_t T,
                           int64_t H, int64_t Hkv, int64_t D) {
  FSDP_CHECK(check_dims("attention_forward", B, T, H, Hkv, D));
  if (!B || !T) return FSDP_OK;
  if (!out || !lse || !q || !k || !v) return fsdp_fail(FSDP_EINVAL, "attention_forward: NULL buffer");
  attn_job j = {.out = out, .lse_out = lse, .q = q, .k = k, .v = v, .B = B, .T = T, .H = H, .Hkv = Hkv, .D = D};
  atomic_init(&j.no_memory, 0);
  fsdp_parallel_gemms(B * H, forward_heads, &j);
  if (atomic_load(&j.no_memory))
    return fsdp_fail(FSDP_ENOMEM, "attention_forward: no memory for a %lld x %lld score block",
                     (long long)block_rows(T), (long long)T);
  return FSDP_OK;
}

/* backward of kv heads lo .. hi - 1 (item = b * Hkv + kv head) with their
 * query heads, one after another: they sum into the same dK, dV rows */
static void backward_groups(void *arg, int64_t lo, int64_t hi) {
  attn_job *j = arg;
  const int64_t T = j->T, H = j->H, Hkv = j->Hkv, D = j->D, rows = block_rows(T);
  float *P = malloc(sizeof(float) * (size_t)rows * (size_t)T * 2);
  if (!P) {
    atomic_store(&j->no_memory, 1);
    return;
  }
  float *dP = P + rows * T;
  const float scale = 1.0f / sqrtf((float)D);
  const int64_t G = H / Hkv, ldq = H * D, ldk = Hkv * D;
  const int d = (int)D;
  for (int64_t item = lo; item < hi; item++) {
    const int64_t b = item / Hkv, ko = b * T * ldk + (item % Hkv) * D;
    const float *kh = j->k + ko, *vh = j->v + ko;
    for (int64_t t = 0; t < T; t++) { /* this group's dK, dV rows: sums start at 0 */
      memset(j->dk + ko + t * ldk, 0, sizeof(float) * (size_t)D);
      memset(j->dv + ko + t * ldk, 0, sizeof(float) * (size_t)D);
    }
    for (int64_t h = (item % Hkv) * G; h < (item % Hkv + 1) * G; h++) {
      const int64_t qo = b * T * ldq + h * D;
      const float *qh = j->q + qo, *doh = j->dout + qo, *oh = j->o + qo;
      const float *L = j->lse + (b * H + h) * T;
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
        fsdp_sgemm(0, 0, bq, d, n, scale, dP, n, kh, ldk, 0.0f, j->dq + qo + bo, ldq);
        fsdp_sgemm(1, 0, n, d, bq, scale, dP, n, qh + bo, ldq, 1.0f, j->dk + ko, ldk);
        fsdp_sgemm(1, 0, n, d, bq, 1.0f, P, n, doh + bo, ldq, 1.0f, j->dv + ko, ldk);
      }
    }
  }
  free(P);
}

int fsdp_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                            const float *v, const float *out, const float *lse, int64_t B, int64_t T, int64_t H,
                            int64_t Hkv, int64_t D) {
  FSDP_CHECK(check_dims("attention_backward", B, T, H, Hkv, D));
  if (!B || !T) return FSDP_OK;
  if (!dq || !dk || !dv || !dout || !q || !k || !v || !out || !lse)
    return fsdp_fail(FSDP_EINVAL, "attention_backward: NULL buffer");
  attn_job j = {.lse = lse, .dq = dq, .dk = dk, .dv = dv, .q = q, .k = k, .v = v, .dout = dout, .o = out,
                .B = B, .T = T, .H = H, .Hkv = Hkv, .D = D};
  atomic_init(&j.no_memory, 0);
  fsdp_parallel_gemms(B * Hkv, backward_groups, &j);
  if (atomic_load(&j.no_memory))
    return fsdp_fail(FSDP_ENOMEM, "attention_backward: no memory for two %lld x %lld blocks",
                     (long long)block_rows(T), (long long)T);
  return FSDP_OK;
}
