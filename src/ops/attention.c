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
 * same bits.
 * Queries at given positions (the _pos calls, attention_pos.c; context
 * parallelism): Tq query rows, row i at position q_pos[i] of Tk keys,
 * sees keys 0 .. q_pos[i] (none at -1: out 0, lse -inf, dq 0). A block is
 * a run of positions that rise by at most one a row (cut where q_pos
 * jumps or falls: a rank's second chunk starts a block; ring attention's
 * runs of one position stay whole, rather than GEMV rows) and multiplies
 * with keys 0 .. its last position alone; a run of -1 is a block of its
 * own that no GEMM sees. With q_pos[i] = i it is the causal computation,
 * the same bits.
 * Both (the _pos_docs calls, attention_pos_docs.c; context parallelism
 * over packed rows): row i of batch row b sees keys q_lo[b, i] .. q_pos[i]
 * (q_lo in the keys' coordinates, as doc_start is), none where q_lo =
 * q_pos + 1. A block is cut as for q_pos and multiplies with the keys from
 * its rows' earliest first to their latest last; a row that sees no key
 * inside a block of rows that do (its document starts after the keys) has
 * its scores and dO zeroed before the GEMMs that sum over rows: out 0, lse
 * -inf, dq 0, nothing to dK, dV, no NaN; a block none of whose rows sees a
 * key has no GEMM, as a run at -1. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "../fsdp_ops.h"
#include "attention_rows.h"
#include "ops.h"
#include "rows.h"

static int check_dims(const char *op, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv, int64_t D) {
  if (B < 0 || Tq < 0 || Tk < 0 || H < 1 || Hkv < 1 || D < 1 || H % Hkv || Tq > INT32_MAX / 2 || Tk > INT32_MAX / 2 ||
      H * D > INT32_MAX)
    return fsdp_fail(FSDP_EINVAL, "%s: batch=%lld seq=%lld (keys %lld) heads=%lld kv_heads=%lld head_dim=%lld (heads must "
                     "be a multiple of kv_heads)", op, (long long)B, (long long)Tq, (long long)Tk, (long long)H,
                     (long long)Hkv, (long long)D);
  return FSDP_OK;
}

/* query rows per block: measured (bench/RESULTS.md); smaller blocks skip
 * more of the upper half but make GEMMs too thin to run at speed */
enum { BLOCK = 64, STACK_ROWS = 256, STACK_FLOATS = 1 << 22 };

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* rows of a score block: a whole block, or all of a shorter sequence (no
 * queries: one, the scratch's shape) */
static int64_t block_rows(int64_t T) { return T < 1 ? 1 : min64(T, BLOCK); }

/* query heads of one kv group stacked into one GEMM: their blocks share
 * K and V, so G heads of BLOCK rows are one GEMM of G BLOCK rows, the
 * shape OpenBLAS runs fastest, up to STACK_ROWS rows; the scores (a row
 * for each of Tk keys) grow with the stack, so long sequences stack fewer
 * heads (16 MiB a buffer beyond one head's block) */
static int64_t stack_heads(int64_t G, int64_t Tq, int64_t Tk) {
  const int64_t rows = block_rows(Tq);
  int64_t s = STACK_ROWS / rows; /* at least 4: rows <= BLOCK */
  while (s > 1 && s * rows * Tk > STACK_FLOATS) s--;
  return min64(s, G);
}

/* rows i0 .. i0 + bq - 1 of heads h0 .. h0 + nh - 1, from a [T, H, D]
 * tensor at x = the first row of head h0 (leading dimension ld), packed
 * head after head into dst [nh bq, D] */
static void gather_rows(float *dst, const float *x, int64_t nh, int64_t bq, int64_t D, int64_t ld) {
  for (int64_t hh = 0; hh < nh; hh++)
    for (int64_t r = 0; r < bq; r++) memcpy(dst + (hh * bq + r) * D, x + r * ld + hh * D, sizeof(float) * (size_t)D);
}

/* the inverse: dst's rows <- src's, each times scale[row] (none: 1; 0: a
 * row that sees no key, exactly 0 whatever src holds) */
static void scatter_rows(float *x, const float *src, const float *scale, int64_t nh, int64_t bq, int64_t D, int64_t ld) {
  for (int64_t s = 0; s < nh * bq; s++) {
    float *row = x + (s % bq) * ld + (s / bq) * D;
    const float *in = src + s * D, f = scale ? scale[s] : 1.0f;
    if (f == 0.0f) memset(row, 0, sizeof(float) * (size_t)D);
    else
      for (int64_t c = 0; c < D; c++) row[c] = in[c] * f;
  }
}

/* one call's shapes and buffers, shared by the threads that take its heads */
typedef struct attn_job {
  float *out, *lse_out, *dq, *dk, *dv;
  const float *q, *k, *v, *dout, *o, *lse;
  const int32_t *doc_start; /* [B, Tq], or NULL: every row one document (with q_pos: q_lo) */
  const int32_t *q_pos;     /* [Tq], or NULL: query i at position i */
  int64_t B, Tq, Tk, H, Hkv, D;
  atomic_int no_memory; /* a thread found no memory for its scratch */
} attn_job;

/* the query rows that go to the GEMMs with row i0: up to BLOCK of them,
 * each at the position of the one before or the next (q_pos: a jump or a
 * fall starts a new block, and rows that see no key, at -1, are blocks
 * of their own) */
static int64_t block_end(const attn_job *j, int64_t i0) {
  const int64_t i1 = min64(i0 + BLOCK, j->Tq);
  if (j->q_pos)
    for (int64_t i = i0 + 1; i < i1; i++) {
      const int32_t p = j->q_pos[i - 1], n = j->q_pos[i];
      if (n < p || n > p + 1 || (p < 0) != (n < 0)) return i;
    }
  return i1;
}

/* rows i0 .. i0 + bq - 1 of heads h0 .. h0 + nh - 1 (as gather_rows) <- 0 */
static void zero_rows(float *x, int64_t nh, int64_t bq, int64_t D, int64_t ld) {
  for (int64_t hh = 0; hh < nh; hh++)
    for (int64_t r = 0; r < bq; r++) memset(x + r * ld + hh * D, 0, sizeof(float) * (size_t)D);
}

/* the keys query row i of a batch row (its doc_start or q_lo ds, or NULL)
 * sees: [*a, *e), none where a = e */
static void row_keys(const attn_job *j, const int32_t *ds, int64_t i, int64_t *a, int64_t *e) {
  *a = ds ? ds[i] : 0;
  *e = (j->q_pos ? j->q_pos[i] : i) + 1;
}

/* the keys rows i0 .. i1 - 1 multiply with, [*k0, *k1): from the earliest
 * first key of a row that sees any (doc_start never falls: the first
 * row's; q_lo may, in a run of one position) to the latest last (a
 * block's positions never fall: the last such row's): no key outside is
 * scored. None (k0 = k1): no row sees a key (a run at -1, documents after
 * the keys), no GEMM, the results fixed */
static void block_keys(const attn_job *j, const int32_t *ds, int64_t i0, int64_t i1, int64_t *k0, int64_t *k1) {
  int64_t lo = INT64_MAX, hi = 0;
  for (int64_t i = i0, a, e; i < i1; i++) {
    row_keys(j, ds, i, &a, &e);
    if (a < e) lo = min64(lo, a), hi = e > hi ? e : hi;
  }
  *k0 = hi ? lo : 0, *k1 = hi;
}

/* forward of head stacks lo .. hi - 1 (item = (b * Hkv + kv head) *
 * stacks + stack: a stack is up to stack_heads query heads of the group) */
static void forward_heads(void *arg, int64_t lo, int64_t hi) {
  attn_job *j = arg;
  const int64_t Tq = j->Tq, Tk = j->Tk, H = j->H, Hkv = j->Hkv, D = j->D, G = H / Hkv, rows = block_rows(Tq);
  const int64_t gs = stack_heads(G, Tq, Tk), stacks = (G + gs - 1) / gs, sr = gs * rows;
  float *S = malloc(sizeof(float) * (size_t)sr * (size_t)(Tk + 2 * D + 1));
  if (!S) {
    atomic_store(&j->no_memory, 1);
    return;
  }
  float *Qs = S + sr * Tk, *Os = Qs + sr * D, *inv = Os + sr * D; /* inv: 1 / each row's sum */
  const float scale = 1.0f / sqrtf((float)D);
  const int64_t ldq = H * D, ldk = Hkv * D;
  const int d = (int)D;
  for (int64_t item = lo; item < hi; item++) {
    const int64_t b = item / (Hkv * stacks), g = item / stacks % Hkv, h0 = g * G + item % stacks * gs;
    const int64_t nh = min64(gs, g * G + G - h0);
    const float *kh = j->k + b * Tk * ldk + g * D, *vh = j->v + b * Tk * ldk + g * D;
    const int32_t *ds = j->doc_start ? j->doc_start + b * Tq : NULL;
    for (int64_t i0 = 0, i1; i0 < Tq; i0 = i1) {
      /* rows i0 .. i1 - 1 see keys k0 .. k1 - 1 (row i: from its document's start, to its position) */
      int64_t k0, k1;
      i1 = block_end(j, i0);
      const int64_t bq = i1 - i0, rowoff = b * Tq * ldq + i0 * ldq + h0 * D;
      block_keys(j, ds, i0, i1, &k0, &k1);
      if (k1 == k0) { /* no key: softmax over nothing, out 0, lse log 0 */
        zero_rows(j->out + rowoff, nh, bq, D, ldq);
        for (int64_t s = 0; s < nh * bq; s++) j->lse_out[(b * H + h0 + s / bq) * Tq + i0 + s % bq] = -INFINITY;
        continue;
      }
      const int m = (int)(nh * bq), n = (int)(k1 - k0);
      gather_rows(Qs, j->q + rowoff, nh, bq, D, ldq);
      fsdp_sgemm(0, 1, m, n, d, scale, Qs, D, kh + k0 * ldk, ldk, 0.0f, S, n);
      for (int64_t s = 0; s < m; s++) { /* e^(S_ij - max_i) for the keys row i sees, else 0; their sum */
        const int64_t i = i0 + s % bq;
        int64_t a, e;
        row_keys(j, ds, i, &a, &e);
        float *row = S + s * n, *lse = j->lse_out + (b * H + h0 + s / bq) * Tq + i;
        if (a == e) { /* this row sees no key: a row of 0 in P, out 0, lse log 0 */
          memset(row, 0, sizeof(float) * (size_t)n);
          *lse = -INFINITY, inv[s] = 0.0f;
          continue;
        }
        a -= k0, e -= k0; /* columns [a, e): e > a, sum >= 1 */
        const float mx = fsdp_row_max(row + a, e - a), sum = fsdp_row_exp_sum(row + a, e - a, mx);
        *lse = mx + logf(sum);
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

int fsdp_attention_pos_check(const int32_t *q_pos, int64_t tq, int64_t tk) {
  if (tq < 0 || tk < 0 || (tq && !q_pos))
    return fsdp_fail(FSDP_EINVAL, "q_pos: %lld queries, %lld keys, buffer %p", (long long)tq, (long long)tk,
                     (const void *)q_pos);
  for (int64_t i = 0; i < tq; i++)
    if (q_pos[i] < -1 || q_pos[i] >= tk)
      return fsdp_fail(FSDP_EINVAL, "q_pos: query %lld at position %d, outside [-1, %lld): one of the %lld keys, or -1 "
                       "(sees none)", (long long)i, q_pos[i], (long long)tk, (long long)tk);
  return FSDP_OK;
}

/* the arguments every call checks (ds with q_pos is q_lo: its caller,
 * attention_pos_docs.c, checks it) */
static int check_call(const char *op, const int32_t *ds, const int32_t *q_pos, int64_t B, int64_t Tq, int64_t Tk,
                      int64_t H, int64_t Hkv, int64_t D) {
  FSDP_CHECK(check_dims(op, B, Tq, Tk, H, Hkv, D));
  if (!B) return FSDP_OK;
  if (ds && !q_pos) FSDP_CHECK(fsdp_doc_start_check(ds, B, Tq));
  if (q_pos) {
    const int rc = fsdp_attention_pos_check(q_pos, Tq, Tk);
    if (rc < 0) return fsdp_fail_context(rc, "%s", op);
  }
  return FSDP_OK;
}

int fsdp_attention_rows_forward(const char *op, float *out, float *lse, const float *q, const float *k, const float *v,
                                const int32_t *ds, const int32_t *q_pos, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                                int64_t Hkv, int64_t D) {
  FSDP_CHECK(check_call(op, ds, q_pos, B, Tq, Tk, H, Hkv, D));
  if (!B || !Tq) return FSDP_OK;
  if (!out || !lse || !q || (Tk && (!k || !v))) return fsdp_fail(FSDP_EINVAL, "%s: NULL buffer", op);
  if (!Tk) { /* no keys (q_pos all -1): out 0, lse -inf; k, v unread (may be NULL) */
    memset(out, 0, sizeof(float) * (size_t)(B * Tq * H * D));
    for (int64_t i = 0; i < B * H * Tq; i++) lse[i] = -INFINITY;
    return FSDP_OK;
  }
  attn_job j = {.out = out, .lse_out = lse, .q = q, .k = k, .v = v, .doc_start = ds, .q_pos = q_pos, .B = B, .Tq = Tq,
                .Tk = Tk, .H = H, .Hkv = Hkv, .D = D};
  atomic_init(&j.no_memory, 0);
  const int64_t G = H / Hkv, gs = stack_heads(G, Tq, Tk);
  fsdp_parallel_gemms(B * Hkv * ((G + gs - 1) / gs), forward_heads, &j);
  if (atomic_load(&j.no_memory))
    return fsdp_fail(FSDP_ENOMEM, "%s: no memory for a %lld x %lld score block", op, (long long)(gs * block_rows(Tq)),
                     (long long)Tk);
  return FSDP_OK;
}

int fsdp_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int64_t B, int64_t T,
                           int64_t H, int64_t Hkv, int64_t D) {
  return fsdp_attention_rows_forward("attention_forward", out, lse, q, k, v, NULL, NULL, B, T, T, H, Hkv, D);
}

int fsdp_attention_forward_docs(float *out, float *lse, const float *q, const float *k, const float *v,
                                const int32_t *doc_start, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  if (!doc_start && B && T) return fsdp_fail(FSDP_EINVAL, "attention_forward_docs: doc_start is NULL");
  return fsdp_attention_rows_forward("attention_forward_docs", out, lse, q, k, v, doc_start, NULL, B, T, T, H, Hkv, D);
}

/* backward of kv heads lo .. hi - 1 (item = b * Hkv + kv head) with their
 * query heads, a stack at a time: they sum into the same dK, dV rows */
static void backward_groups(void *arg, int64_t lo, int64_t hi) {
  attn_job *j = arg;
  const int64_t Tq = j->Tq, Tk = j->Tk, H = j->H, Hkv = j->Hkv, D = j->D, G = H / Hkv, rows = block_rows(Tq);
  const int64_t gs = stack_heads(G, Tq, Tk), sr = gs * rows;
  float *P = malloc(sizeof(float) * (size_t)sr * (size_t)(2 * Tk + 3 * D + 2));
  if (!P) {
    atomic_store(&j->no_memory, 1);
    return;
  }
  float *dP = P + sr * Tk, *Qs = dP + sr * Tk, *dOs = Qs + sr * D, *dQs = dOs + sr * D, *Di = dQs + sr * D;
  float *seen = Di + sr; /* 1: the row sees a key, 0: none (its dq row 0) */
  const float scale = 1.0f / sqrtf((float)D);
  const int64_t ldq = H * D, ldk = Hkv * D;
  const int d = (int)D;
  for (int64_t item = lo; item < hi; item++) {
    const int64_t b = item / Hkv, g = item % Hkv, ko = b * Tk * ldk + g * D;
    const float *kh = j->k + ko, *vh = j->v + ko;
    const int32_t *ds = j->doc_start ? j->doc_start + b * Tq : NULL;
    for (int64_t t = 0; t < Tk; t++) { /* this group's dK, dV rows: sums start at 0 */
      memset(j->dk + ko + t * ldk, 0, sizeof(float) * (size_t)D);
      memset(j->dv + ko + t * ldk, 0, sizeof(float) * (size_t)D);
    }
    for (int64_t h0 = g * G; h0 < g * G + G; h0 += gs) {
      const int64_t nh = min64(gs, g * G + G - h0);
      for (int64_t i0 = 0, i1; i0 < Tq; i0 = i1) {
        int64_t k0, k1; /* keys k0 .. k1 - 1, as in forward */
        i1 = block_end(j, i0);
        const int64_t bq = i1 - i0, rowoff = b * Tq * ldq + i0 * ldq + h0 * D;
        block_keys(j, ds, i0, i1, &k0, &k1);
        if (k1 == k0) { /* dq 0, nothing to dK, dV; dout, out, lse unread */
          zero_rows(j->dq + rowoff, nh, bq, D, ldq);
          continue;
        }
        const int m = (int)(nh * bq), n = (int)(k1 - k0);
        gather_rows(Qs, j->q + rowoff, nh, bq, D, ldq);
        gather_rows(dOs, j->dout + rowoff, nh, bq, D, ldq);
        for (int64_t s = 0; s < m; s++) { /* rowsum(dO * O) = sum_j P_ij dP_ij */
          int64_t a, e;
          row_keys(j, ds, i0 + s % bq, &a, &e);
          seen[s] = a < e;
          if (!seen[s]) { /* no key: dO 0 (its dout, out, lse not used), so nothing to dV */
            memset(dOs + s * D, 0, sizeof(float) * (size_t)D);
            continue;
          }
          const float *o = j->o + rowoff + (s % bq) * ldq + (s / bq) * D;
          double di = 0;
          for (int64_t c = 0; c < D; c++) di += (double)dOs[s * D + c] * o[c];
          Di[s] = (float)di;
        }
        fsdp_sgemm(0, 1, m, n, d, scale, Qs, D, kh + k0 * ldk, ldk, 0.0f, P, n);
        fsdp_sgemm(0, 1, m, n, d, 1.0f, dOs, D, vh + k0 * ldk, ldk, 0.0f, dP, n);
        for (int64_t s = 0; s < m; s++) {
          const int64_t i = i0 + s % bq;
          float *p = P + s * n, *dp = dP + s * n;
          if (!seen[s]) { /* P, dS 0: nothing to dQ, dK, dV */
            memset(p, 0, sizeof(float) * (size_t)n);
            memset(dp, 0, sizeof(float) * (size_t)n);
            continue;
          }
          int64_t a, e;
          row_keys(j, ds, i, &a, &e);
          a -= k0, e -= k0; /* columns [a, e) */
          fsdp_row_exp_scaled(p + a, e - a, j->lse[(b * H + h0 + s / bq) * Tq + i], 1.0f);
          fsdp_row_softmax_grad(dp + a, p + a, e - a, Di[s]);
          memset(p, 0, sizeof(float) * (size_t)a);
          memset(dp, 0, sizeof(float) * (size_t)a);
          memset(p + e, 0, sizeof(float) * (size_t)(n - e));
          memset(dp + e, 0, sizeof(float) * (size_t)(n - e));
        }
        /* dQ rows i0 .. i1 - 1 of the stack's heads; dK, dV rows k0 .. k1 - 1
         * gather this block's share */
        fsdp_sgemm(0, 0, m, d, n, scale, dP, n, kh + k0 * ldk, ldk, 0.0f, dQs, d);
        scatter_rows(j->dq + rowoff, dQs, seen, nh, bq, D, ldq);
        fsdp_sgemm(1, 0, n, d, m, scale, dP, n, Qs, D, 1.0f, j->dk + ko + k0 * ldk, ldk);
        fsdp_sgemm(1, 0, n, d, m, 1.0f, P, n, dOs, D, 1.0f, j->dv + ko + k0 * ldk, ldk);
      }
    }
  }
  free(P);
}

int fsdp_attention_rows_backward(const char *op, float *dq, float *dk, float *dv, const float *dout, const float *q,
                                 const float *k, const float *v, const float *out, const float *lse, const int32_t *ds,
                                 const int32_t *q_pos, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv,
                                 int64_t D) {
  FSDP_CHECK(check_call(op, ds, q_pos, B, Tq, Tk, H, Hkv, D));
  if (!B || (!Tk && !Tq)) return FSDP_OK;
  /* no queries (Tq 0): dK, dV still overwritten, with zeros; no keys (Tk
   * 0, q_pos all -1): dQ, with zeros, k, v, dk, dv untouched (may be NULL) */
  if ((Tk && (!dk || !dv || !k || !v)) || (Tq && (!dq || !dout || !q || !out || !lse)))
    return fsdp_fail(FSDP_EINVAL, "%s: NULL buffer", op);
  if (!Tk) {
    memset(dq, 0, sizeof(float) * (size_t)(B * Tq * H * D));
    return FSDP_OK;
  }
  attn_job j = {.lse = lse, .dq = dq, .dk = dk, .dv = dv, .q = q, .k = k, .v = v, .dout = dout, .o = out,
                .doc_start = ds, .q_pos = q_pos, .B = B, .Tq = Tq, .Tk = Tk, .H = H, .Hkv = Hkv, .D = D};
  atomic_init(&j.no_memory, 0);
  fsdp_parallel_gemms(B * Hkv, backward_groups, &j);
  if (atomic_load(&j.no_memory))
    return fsdp_fail(FSDP_ENOMEM, "%s: no memory for two %lld x %lld blocks", op,
                     (long long)(stack_heads(H / Hkv, Tq, Tk) * block_rows(Tq)), (long long)Tk);
  return FSDP_OK;
}

int fsdp_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                            const float *v, const float *out, const float *lse, int64_t B, int64_t T, int64_t H,
                            int64_t Hkv, int64_t D) {
  return fsdp_attention_rows_backward("attention_backward", dq, dk, dv, dout, q, k, v, out, lse, NULL, NULL, B, T, T, H,
                                      Hkv, D);
}

int fsdp_attention_backward_docs(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                                 const float *v, const float *out, const float *lse, const int32_t *doc_start, int64_t B,
                                 int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  if (!doc_start && B && T) return fsdp_fail(FSDP_EINVAL, "attention_backward_docs: doc_start is NULL");
  return fsdp_attention_rows_backward("attention_backward_docs", dq, dk, dv, dout, q, k, v, out, lse, doc_start, NULL, B,
                                      T, T, H, Hkv, D);
}
