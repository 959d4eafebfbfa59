/* attention_pos_docs.c: attention for queries at given positions over
 * packed rows (context parallelism over documents). The _pos calls'
 * queries (attention_pos.c: q_pos [tq], shared by the batch rows) each
 * start at the first key of their own document within this block of keys,
 * q_lo [B, tq] (in the keys' coordinates: a document that began before the
 * block starts at 0), so that no attention crosses a document boundary
 * under context parallelism. A query whose document starts after its
 * position in this block (q_lo = q_pos + 1; ring attention's step against
 * keys before that document) sees no key: out 0, lse -inf, so that the
 * steps' merge passes it by; backward: dq 0, nothing to dK, dV, its dout,
 * out and lse not used. Such rows may sit inside a block of rows that do
 * see keys; attention.c zeroes their scores and dO before the GEMMs that
 * sum over rows. The computation is attention.c's (attention_rows.h, q_lo
 * its ds): q_lo all 0 is the _pos call, the same bits. */
#include "../base/error.h"
#include "../fsdp_ops.h"
#include "attention_rows.h"

int fsdp_attention_pos_docs_check(const int32_t *q_pos, const int32_t *q_lo, int64_t batch, int64_t tq, int64_t tk) {
  FSDP_CHECK(fsdp_attention_pos_check(q_pos, tq, tk));
  if (batch < 0 || (batch && tq && !q_lo))
    return fsdp_fail(FSDP_EINVAL, "q_lo: batch=%lld, %lld queries, buffer %p", (long long)batch, (long long)tq,
                     (const void *)q_lo);
  for (int64_t b = 0; b < batch; b++)
    for (int64_t i = 0; i < tq; i++) {
      const int32_t lo = q_lo[b * tq + i];
      const int64_t p = q_pos[i];
      if (lo < 0 || lo > p + 1)
        return fsdp_fail(FSDP_EINVAL, "q_lo: batch row %lld, query %lld (at position %lld) holds %d, outside [0, %lld]: "
                         "a key up to its position, or %lld (sees none)", (long long)b, (long long)i, (long long)p, lo,
                         (long long)p + 1, (long long)p + 1);
      if (i && p == q_pos[i - 1] + 1 && lo < q_lo[b * tq + i - 1])
        return fsdp_fail(FSDP_EINVAL, "q_lo: batch row %lld, query %lld (at position %lld) holds %d, below query %lld's "
                         "%d: within a run of positions rising by one q_lo never falls", (long long)b, (long long)i,
                         (long long)p, lo, (long long)i - 1, q_lo[b * tq + i - 1]);
    }
  return FSDP_OK;
}

/* q_pos and q_lo (the core checks q_pos alone, and would take q_lo NULL
 * for the _pos call) */
static int check_indices(const char *op, const int32_t *q_pos, const int32_t *q_lo, int64_t batch, int64_t tq,
                         int64_t tk) {
  if (batch <= 0 || tq <= 0) return FSDP_OK; /* no rows: the core's checks */
  if (!q_pos || !q_lo) return fsdp_fail(FSDP_EINVAL, "%s: %s is NULL", op, q_pos ? "q_lo" : "q_pos");
  const int rc = fsdp_attention_pos_docs_check(q_pos, q_lo, batch, tq, tk);
  return rc < 0 ? fsdp_fail_context(rc, "%s", op) : FSDP_OK;
}

int fsdp_attention_forward_pos_docs(float *out, float *lse, const float *q, const float *k, const float *v,
                                    const int32_t *q_pos, const int32_t *q_lo, int64_t batch, int64_t tq, int64_t tk,
                                    int64_t heads, int64_t kv_heads, int64_t head_dim) {
  static const char op[] = "attention_forward_pos_docs";
  FSDP_CHECK(check_indices(op, q_pos, q_lo, batch, tq, tk));
  return fsdp_attention_rows_forward(op, out, lse, q, k, v, q_lo, q_pos, batch, tq, tk, heads, kv_heads, head_dim);
}

int fsdp_attention_backward_pos_docs(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                     const float *k, const float *v, const float *out, const float *lse,
                                     const int32_t *q_pos, const int32_t *q_lo, int64_t batch, int64_t tq, int64_t tk,
                                     int64_t heads, int64_t kv_heads, int64_t head_dim) {
  static const char op[] = "attention_backward_pos_docs";
  FSDP_CHECK(check_indices(op, q_pos, q_lo, batch, tq, tk));
  return fsdp_attention_rows_backward(op, dq, dk, dv, dout, q, k, v, out, lse, q_lo, q_pos, batch, tq, tk, heads,
                                      kv_heads, head_dim);
}
