/* attention_rows.h: attention.c's blocked computation, for the ops that
 * share it: the causal and packed-row calls (attention.c), queries at
 * given positions (attention_pos.c) and both (attention_pos_docs.c). q,
 * out [B, Tq, H, D]; k, v, dk, dv [B, Tk, Hkv, D]; lse [B, H, Tq]. Query i
 * sees keys lo .. e - 1 with lo = ds[b, i] (ds [B, Tq]: without q_pos
 * doc_start, fsdp_doc_start_check's rules, Tq = Tk; with it q_lo,
 * fsdp_attention_pos_docs_check's, which the caller checks) or 0, and e = q_pos[i] + 1 (q_pos
 * [Tq], each in [-1, Tk)) or i + 1. A query with lo = e (q_pos -1, or q_lo
 * q_pos + 1) sees no key: its out row 0 and lse -inf, its dq row 0,
 * nothing to dk, dv. `op` names the call in the errors. dq, dk, dv
 * overwritten. */
#ifndef FSDP_OPS_ATTENTION_ROWS_H
#define FSDP_OPS_ATTENTION_ROWS_H

#include <stdint.h>

int fsdp_attention_rows_forward(const char *op, float *out, float *lse, const float *q, const float *k, const float *v,
                                const int32_t *ds, const int32_t *q_pos, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                                int64_t Hkv, int64_t D);
int fsdp_attention_rows_backward(const char *op, float *dq, float *dk, float *dv, const float *dout, const float *q,
                                 const float *k, const float *v, const float *out, const float *lse, const int32_t *ds,
                                 const int32_t *q_pos, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv,
                                 int64_t D);

#endif
