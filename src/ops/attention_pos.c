/* attention_pos.c: attention for queries at given positions (context
 * parallelism, issue 46). A context-parallel rank holds some rows of the
 * sequence (with cp ranks, chunks r and 2 cp - 1 - r of 2 cp equal
 * chunks: each rank the same causal work); its Tq queries sit at their
 * global positions q_pos, and each sees the keys of the whole sequence
 * (Tk of them, gathered over the ranks in global order) up to its own
 * position. Ring attention calls it once a step, against one rank's
 * block of keys (Tk = 2c of them), with runs of one position (a chunk
 * that sees a whole chunk of keys: q_pos c - 1) and rows that see no key
 * at all (q_pos -1: out 0, lse -inf, so that the steps' merge passes
 * them by; backward: dq 0, nothing to dK, dV, their dout, out and lse
 * unread). The computation is attention.c's (attention_rows.h): query
 * blocks whose positions rise by at most one a row, each through the keys
 * up to its last position alone, and no GEMM for rows at -1; with q_pos[i]
 * = i it is the causal op, the same bits. Backward writes the whole
 * sequence's dK, dV, which the caller reduce-scatters to the chunks'
 * owners. */
#include "../base/error.h"
#include "../fsdp_ops.h"
#include "attention_rows.h"

int fsdp_attention_forward_pos(float *out, float *lse, const float *q, const float *k, const float *v,
                               const int32_t *q_pos, int64_t batch, int64_t tq, int64_t tk, int64_t heads,
                               int64_t kv_heads, int64_t head_dim) {
  if (!q_pos && batch && tq) return fsdp_fail(FSDP_EINVAL, "attention_forward_pos: q_pos is NULL");
  return fsdp_attention_rows_forward("attention_forward_pos", out, lse, q, k, v, NULL, q_pos, batch, tq, tk, heads,
                                     kv_heads, head_dim);
}

int fsdp_attention_backward_pos(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                                const float *v, const float *out, const float *lse, const int32_t *q_pos, int64_t batch,
                                int64_t tq, int64_t tk, int64_t heads, int64_t kv_heads, int64_t head_dim) {
  if (!q_pos && batch && tq) return fsdp_fail(FSDP_EINVAL, "attention_backward_pos: q_pos is NULL");
  return fsdp_attention_rows_backward("attention_backward_pos", dq, dk, dv, dout, q, k, v, out, lse, NULL, q_pos, batch,
                                      tq, tk, heads, kv_heads, head_dim);
}
