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
 * The query heads of a kv group read the same K and V, so their blocks
 * go to the GEMMs stacked, up to STACK_ROWS rows (4 heads of 64 rows at
 * Llama's grouping): one GEMM of 256 rows instead of four of 64, each
 * through K and V once (the rows are packed; a head's rows are strided).
 * Threads: the forward's (batch, stack of heads) items, and the backward's
 * (batch, kv head) groups (a group's query heads sum into the same dK, dV
 * rows), are shared among the rank's CPU threads, each GEMM then on one
 * thread (fsdp_parallel_gemms); each item computes as it would alone on
 * one thread, so the bits are the same for any number of threads sharing
 * the heads (a run whose heads stay on one thread, their GEMMs threaded,
 * may differ in the last bits: OpenBLAS's threads split a GEMM otherwise).
 * Packed rows (the _docs calls): query i sees keys doc_start[i] .. i, so
 * block [i0, i1) multiplies with keys doc_start[i0] .. i1 - 1 alone (the
 * block's first row has the earliest start) and each row's softmax runs
 * over its own document's keys: a row of short documents costs less than
 * a causal row, and with doc_start all 0 it is the causal computation, the
 * same bits. */
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
enum { BLOCK = 64, STACK_ROWS = 256, STACK_FLOATS = 1 << 22 };

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* rows of a score block: a whole block, or all of a shorter sequence */
static int64_t block_rows(int64_t T) { return min64(T, BLOCK); }

/* query heads of one kv group stacked into one GEMM: their blocks share
 * K and V, so G heads of BLOCK rows are one GEMM of G BLOCK rows, the
 * shape OpenBLAS runs fastest, up to STACK_ROWS rows; the scores grow
 * with the stack, so long sequences stack fewer heads (16 MiB a buffer
 * beyond one head's block) */
static int64_t stack_heads(int64_t G, int64_t T) {
  const int64_t rows = block_rows(T);
  int64_t s = STACK_ROWS / rows; /* at least 4: rows <= BLOCK */
  while (s > 1 && s * rows * T > STACK_FLOATS) s--;
  return min64(s, G);
}

/* rows i0 .. i0 + bq - 1 of heads h0 .. h0 + nh - 1, from a [T, H, D]
 * tensor at x = the first row of head h0 (leading dimension ld), packed
 * head after head into dst [nh bq, D] */
static void gather_rows(float *dst, const float *x, int64_t nh, int64_t bq, int64_t D, int64_t ld) {
  for (int64_t hh = 0; hh < nh; hh++)
    for (int64_t r = 0; r < bq; r++) memcpy(dst + (hh * bq + r) * D, x + r * ld + hh * D, sizeof(float) * (size_t)D);
}

/* the inverse: dst's rows <- src's, each times scale[row] (none: 1) */
static void scatter_rows(float *x, const float *src, const float *scale, int64_t nh, int64_t bq, int64_t D, int64_t ld) {
  for (int64_t s = 0; s < nh * bq; s++) {
    float *row = x + (s % bq) * ld + (s / bq) * D;
    const float *in = src + s * D, f = scale ? scale[s] : 1.0f;
    for (int64_t c = 0; c < D; c++) row[c] = in[c] * f;
  }
}

/* one call's shapes and buffers, shared by the threads that take its heads */
typedef struct attn_job {
  float *out, *lse_out, *dq, *dk, *dv;
  const float *q, *k, *v, *dout, *o, *lse;
  const int32_t *doc_start; /* [B, T], or NULL: every row one document */
  int64_t B, T, H, Hkv, D;
  atomic_int no_memory; /* a thread found no memory for its scratch */
} attn_job;

/* forward of head stacks lo .. hi - 1 (item = (b * Hkv + kv head) *
 * stacks + stack: a stack is up to stack_heads query heads of the group) */
static void forward_heads(void *arg, int64_t lo, int64_t hi) {
  attn_job *j = arg;
  const int64_t T = j->T, H = j->H, Hkv = j->Hkv, D = j->D, G = H / Hkv, rows = block_rows(T);
  const int64_t gs = stack_heads(G, T), stacks = (G + gs - 1) / gs, sr = gs * rows;
  float *S = malloc(sizeof(float) * (size_t)sr * (size_t)(T + 2 * D + 1));
  if (!S) {
    atomic_store(&j->no_memory, 1);
    return;
  }
  float *Qs = S + sr * T, *Os = Qs + sr * D, *inv = Os + sr * D; /* inv: 1 / each row's sum */
  const float scale = 1.0f / sqrtf((float)D);
  const int64_t ldq = H * D, ldk = Hkv * D;
  const int d = (int)D;
  for (int64_t item = lo; item < hi; item++) {
    const int64_t b = item / (Hkv * stacks), g = item / stacks % Hkv, h0 = g * G + item % stacks * gs;
    const int64_t nh = min64(gs, g * G + G - h0);
    const float *kh = j->k + b * T * ldk + g * D, *vh = j->v + b * T * ldk + g * D;
    const int32_t *ds = j->doc_start ? j->doc_start + b * T : NULL;
    for (int64_t i0 = 0; i0 < T; i0 += BLOCK) {
      /* rows i0 .. i1 - 1 see keys k0 .. i1 - 1 (row i: from its document's start) */
      const int64_t i1 = min64(i0 + BLOCK, T), k0 = ds ? ds[i0] : 0;
      const int64_t bq = i1 - i0, rowoff = b * T * ldq + i0 * ldq + h0 * D;
      const int m = (int)(nh * bq), n = (int)(i1 - k0);
      gather_rows(Qs, j->q + rowoff, nh, bq, D, ldq);
      fsdp_sgemm(0, 1, m, n, d, scale, Qs, D, kh + k0 * ldk, ldk, 0.0f, S, n);
      for (int64_t s = 0; s < m; s++) { /* e^(S_ij - max_i) for the keys row i sees, else 0; their sum */
        const int64_t i = i0 + s % bq, a = (ds ? ds[i] : 0) - k0, e = i - k0 + 1; /* columns [a, e) */
        float *row = S + s * n;
        const float mx = fsdp_row_max(row + a, e - a), sum = fsdp_row_exp_sum(row + a, e - a, mx);
        j->lse_out[(b * H + h0 + s / bq) * T + i] = mx + logf(sum);
        inv[s] = 1.0f / sum;
        memset(row, 0, sizeof(float) * (size_t)a);
        memset(row + e, 0, sizeof(float) * (size_t)(n - e));
      }
      /* O = P V with P's rows normalised after the product: D values a
       * row instead of i + 1 */
      fsdp_sgemm(0, 0, m, d, n, 1.0f, S, n, vh + k0 * ldk, ldk, 0.0f, Os, d);
      scatter_rows(j->out + rowoff, Os, inv, nh, bq, D, ldq);
    }
  }
  free(S);
}

int fsdp_doc_start_check(const int32_t *ds, int64_t B, int64_t T) {
  if (B < 0 || T < 0 || (B && T && !ds))
    return fsdp_fail(FSDP_EINVAL, "doc_start: batch=%lld seq=%lld, buffer %p", (long long)B, (long long)T, (const void *)ds);
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++) {
      const int32_t v = ds[b * T + t];
      if (v != t && (t == 0 || v != ds[b * T + t - 1]))
        return fsdp_fail(FSDP_EINVAL, "doc_start: row %lld position %lld holds %d; expected %lld (a document starts) or "
                         "%d (the position before's)", (long long)b, (long long)t, v, (long long)t,
                         t ? ds[b * T + t - 1] : 0);
    }
  return FSDP_OK;
}

static int forward(const char *op, float *out, float *lse, const float *q, const float *k, const float *v,
                   const int32_t *ds, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  FSDP_CHECK(check_dims(op, B, T, H, Hkv, D));
  if (!B || !T) return FSDP_OK;
  if (!out || !lse || !q || !k || !v) return fsdp_fail(FSDP_EINVAL, "%s: NULL buffer", op);
  if (ds) FSDP_CHECK(fsdp_doc_start_check(ds, B, T));
  attn_job j = {.out = out, .lse_out = lse, .q = q, .k = k, .v = v, .doc_start = ds, .B = B, .T = T, .H = H, .Hkv = Hkv,
                .D = D};
  atomic_init(&j.no_memory, 0);
  const int64_t G = H / Hkv, gs = stack_heads(G, T);
  fsdp_parallel_gemms(B * Hkv * ((G + gs - 1) / gs), forward_heads, &j);
  if (atomic_load(&j.no_memory))
    return fsdp_fail(FSDP_ENOMEM, "%s: no memory for a %lld x %lld score block", op, (long long)(gs * block_rows(T)),
                     (long long)T);
  return FSDP_OK;
}

int fsdp_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int64_t B, int64_t T,
                           int64_t H, int64_t Hkv, int64_t D) {
  return forward("attention_forward", out, lse, q, k, v, NULL, B, T, H, Hkv, D);
}

int fsdp_attention_forward_docs(float *out, float *lse, const float *q, const float *k, const float *v,
                                const int32_t *doc_start, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  if (!doc_start && B && T) return fsdp_fail(FSDP_EINVAL, "attention_forward_docs: doc_start is NULL");
  return forward("attention_forward_docs", out, lse, q, k, v, doc_start, B, T, H, Hkv, D);
}

/* backward of kv heads lo .. hi - 1 (item = b * Hkv + kv head) with their
 * query heads, a stack at a time: they sum into the same dK, dV rows */
static void backward_groups(void *arg, int64_t lo, int64_t hi) {
  attn_job *j = arg;
  const int64_t T = j->T, H = j->H, Hkv = j->Hkv, D = j->D, G = H / Hkv, rows = block_rows(T);
  const int64_t gs = stack_heads(G, T), sr = gs * rows;
  float *P = malloc(sizeof(float) * (size_t)sr * (size_t)(2 * T + 3 * D + 1));
  if (!P) {
    atomic_store(&j->no_memory, 1);
    return;
  }
  float *dP = P + sr * T, *Qs = dP + sr * T, *dOs = Qs + sr * D, *dQs = dOs + sr * D, *Di = dQs + sr * D;
  const float scale = 1.0f / sqrtf((float)D);
  const int64_t ldq = H * D, ldk = Hkv * D;
  const int d = (int)D;
  for (int64_t item = lo; item < hi; item++) {
    const int64_t b = item / Hkv, g = item % Hkv, ko = b * T * ldk + g * D;
    const float *kh = j->k + ko, *vh = j->v + ko;
    const int32_t *ds = j->doc_start ? j->doc_start + b * T : NULL;
    for (int64_t t = 0; t < T; t++) { /* this group's dK, dV rows: sums start at 0 */
      memset(j->dk + ko + t * ldk, 0, sizeof(float) * (size_t)D);
      memset(j->dv + ko + t * ldk, 0, sizeof(float) * (size_t)D);
    }
    for (int64_t h0 = g * G; h0 < g * G + G; h0 += gs) {
      const int64_t nh = min64(gs, g * G + G - h0);
      for (int64_t i0 = 0; i0 < T; i0 += BLOCK) {
        const int64_t i1 = min64(i0 + BLOCK, T), bq = i1 - i0, rowoff = b * T * ldq + i0 * ldq + h0 * D;
        const int64_t k0 = ds ? ds[i0] : 0; /* keys k0 .. i1 - 1, as in forward */
        const int m = (int)(nh * bq), n = (int)(i1 - k0);
        gather_rows(Qs, j->q + rowoff, nh, bq, D, ldq);
        gather_rows(dOs, j->dout + rowoff, nh, bq, D, ldq);
        for (int64_t s = 0; s < m; s++) { /* rowsum(dO * O) = sum_j P_ij dP_ij */
          const float *o = j->o + rowoff + (s % bq) * ldq + (s / bq) * D;
          double di = 0;
          for (int64_t c = 0; c < D; c++) di += (double)dOs[s * D + c] * o[c];
          Di[s] = (float)di;
        }
        fsdp_sgemm(0, 1, m, n, d, scale, Qs, D, kh + k0 * ldk, ldk, 0.0f, P, n);
        fsdp_sgemm(0, 1, m, n, d, 1.0f, dOs, D, vh + k0 * ldk, ldk, 0.0f, dP, n);
        for (int64_t s = 0; s < m; s++) {
          const int64_t i = i0 + s % bq, a = (ds ? ds[i] : 0) - k0, e = i - k0 + 1; /* columns [a, e) */
          float *p = P + s * n, *dp = dP + s * n;
          fsdp_row_exp_scaled(p + a, e - a, j->lse[(b * H + h0 + s / bq) * T + i], 1.0f);
          fsdp_row_softmax_grad(dp + a, p + a, e - a, Di[s]);
          memset(p, 0, sizeof(float) * (size_t)a);
          memset(dp, 0, sizeof(float) * (size_t)a);
          memset(p + e, 0, sizeof(float) * (size_t)(n - e));
          memset(dp + e, 0, sizeof(float) * (size_t)(n - e));
        }
        /* dQ rows i0 .. i1 - 1 of the stack's heads; dK, dV rows k0 .. i1 - 1
         * gather this block's share */
        fsdp_sgemm(0, 0, m, d, n, scale, dP, n, kh + k0 * ldk, ldk, 0.0f, dQs, d);
        scatter_rows(j->dq + rowoff, dQs, NULL, nh, bq, D, ldq);
        fsdp_sgemm(1, 0, n, d, m, scale, dP, n, Qs, D, 1.0f, j->dk + ko + k0 * ldk, ldk);
        fsdp_sgemm(1, 0, n, d, m, 1.0f, P, n, dOs, D, 1.0f, j->dv + ko + k0 * ldk, ldk);
      }
    }
  }
  free(P);
}

static int backward(const char *op, float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                    const float *v, const float *out, const float *lse, const int32_t *ds, int64_t B, int64_t T,
                    int64_t H, int64_t Hkv, int64_t D) {
  FSDP_CHECK(check_dims(op, B, T, H, Hkv, D));
  if (!B || !T) return FSDP_OK;
  if (!dq || !dk || !dv || !dout || !q || !k || !v || !out || !lse) return fsdp_fail(FSDP_EINVAL, "%s: NULL buffer", op);
  if (ds) FSDP_CHECK(fsdp_doc_start_check(ds, B, T));
  attn_job j = {.lse = lse, .dq = dq, .dk = dk, .dv = dv, .q = q, .k = k, .v = v, .dout = dout, .o = out,
                .doc_start = ds, .B = B, .T = T, .H = H, .Hkv = Hkv, .D = D};
  atomic_init(&j.no_memory, 0);
  fsdp_parallel_gemms(B * Hkv, backward_groups, &j);
  if (atomic_load(&j.no_memory))
    return fsdp_fail(FSDP_ENOMEM, "%s: no memory for two %lld x %lld blocks", op,
                     (long long)(stack_heads(H / Hkv, T) * block_rows(T)), (long long)T);
  return FSDP_OK;
}

int fsdp_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                            const float *v, const float *out, const float *lse, int64_t B, int64_t T, int64_t H,
                            int64_t Hkv, int64_t D) {
  return backward("attention_backward", dq, dk, dv, dout, q, k, v, out, lse, NULL, B, T, H, Hkv, D);
}

int fsdp_attention_backward_docs(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                                 const float *v, const float *out, const float *lse, const int32_t *doc_start, int64_t B,
                                 int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  if (!doc_start && B && T) return fsdp_fail(FSDP_EINVAL, "attention_backward_docs: doc_start is NULL");
  return backward("attention_backward_docs", dq, dk, dv, dout, q, k, v, out, lse, doc_start, B, T, H, Hkv, D);
}
