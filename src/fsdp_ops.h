/* fsdp_ops.h: the ops layer's API (src/ops/): forward and backward of the
 * model's operations on the CPU, fp32 (their CUDA twins are the kernels'
 * API, fsdp_kernels.h). Part of the public API: included by fsdp.h, read
 * by ffi.lua, FFI-clean like it (no macros in declarations). */
#ifndef FSDP_OPS_API_H
#define FSDP_OPS_API_H

#include "fsdp_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- ops (CPU, fp32; src/ops/) --------------------------------------- */
/* y[n, out] = x[n, in] W[out, in]^T + b (b may be NULL) */
int fsdp_linear_forward(float *y, const float *x, const float *w, const float *b, int64_t n, int64_t in, int64_t out);
/* dx = dy W (dx may be NULL); dW += dy^T x; db += column sums of dy (may be NULL) */
int fsdp_linear_backward(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w, int64_t n,
                         int64_t in, int64_t out);
int fsdp_tanh_forward(float *y, const float *x, int64_t n);
int fsdp_tanh_backward(float *dx, const float *dy, const float *y, int64_t n);
/* loss = mean (x - t)^2; dx (may be NULL) = scale * 2 (x - t) / n */
int fsdp_mse_forward_backward(double *loss, float *dx, const float *x, const float *target, int64_t n, float scale);

/* ---- the Llama ops (CPU, fp32; one file each in src/ops/) ------------- */
/* y[n, dim] = table[ids[i]]; an id outside [0, vocab) is an error */
int fsdp_embedding_forward(float *y, const int32_t *ids, const float *table, int64_t n, int64_t vocab, int64_t dim);
/* dtable[ids[i]] += dy[i] (accumulates) */
int fsdp_embedding_backward(float *dtable, const float *dy, const int32_t *ids, int64_t n, int64_t vocab, int64_t dim);
/* the same for a vocab-parallel slice holding rows [first, first + rows) of
 * the table: ids outside them give zero rows, and no gradient */
int fsdp_embedding_forward_slice(float *y, const int32_t *ids, const float *table, int64_t n, int64_t vocab,
                                 int64_t first, int64_t rows, int64_t dim);
int fsdp_embedding_backward_slice(float *dtable, const float *dy, const int32_t *ids, int64_t n, int64_t vocab,
                                  int64_t first, int64_t rows, int64_t dim);
/* y = w * x / sqrt(mean(x^2) + eps) per row of dim; rstd[n] (may be NULL) saved for backward */
int fsdp_rmsnorm_forward(float *y, float *rstd, const float *x, const float *w, int64_t n, int64_t dim, float eps);
/* dx overwritten; dw (may be NULL) accumulates */
int fsdp_rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd,
                          int64_t n, int64_t dim);
/* Llama-3 rope scaling (transformers' rope_type "llama3") */
typedef struct fsdp_rope_scaling {
  float factor, low_freq_factor, high_freq_factor;
  int64_t original_max_position_embeddings;
} fsdp_rope_scaling;
/* cos, sin: [seq, head_dim], HF's cat(freqs, freqs) layout; scaling may be NULL */
int fsdp_rope_table(float *cos_t, float *sin_t, int64_t seq, int64_t head_dim, double theta, const fsdp_rope_scaling *scaling);
/* in place on x [batch, seq, heads, head_dim], rotate-half convention */
int fsdp_rope_forward(float *x, const float *cos_t, const float *sin_t, int64_t batch, int64_t seq, int64_t heads,
                      int64_t head_dim);
/* in place on dx: the transpose of the rotation */
int fsdp_rope_backward(float *dx, const float *cos_t, const float *sin_t, int64_t batch, int64_t seq, int64_t heads,
                       int64_t head_dim);
/* causal attention; q, out [B, T, H, D]; k, v [B, T, Hkv, D]; lse [B, H, T] saved for backward */
int fsdp_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int64_t batch,
                           int64_t seq, int64_t heads, int64_t kv_heads, int64_t head_dim);
/* dq, dk, dv overwritten */
int fsdp_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                            const float *v, const float *out, const float *lse, int64_t batch, int64_t seq, int64_t heads,
                            int64_t kv_heads, int64_t head_dim);
/* Packed rows (several documents in one row of T): doc_start [B, T] is the
 * first position of the document position t is in (t - doc_start[t] is its
 * position within it). Within a row it starts at 0, and each entry is t
 * itself (a document starts) or the entry before it. Query t sees keys
 * doc_start[t] .. t alone: no attention crosses a document boundary.
 * fsdp_doc_start_check: FSDP_EINVAL, naming the row and position, unless so. */
int fsdp_doc_start_check(const int32_t *doc_start, int64_t batch, int64_t seq);
int fsdp_attention_forward_docs(float *out, float *lse, const float *q, const float *k, const float *v,
                                const int32_t *doc_start, int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                int64_t head_dim);
int fsdp_attention_backward_docs(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                                 const float *v, const float *out, const float *lse, const int32_t *doc_start,
                                 int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads, int64_t head_dim);
/* Queries at given positions (context parallelism: a rank's chunks of the
 * sequence, src/ops/attention_pos.c): q, out [B, tq, H, D] at positions
 * q_pos [tq] (the same for every batch row, each in [-1, tk)); k, v [B, tk,
 * Hkv, D], the whole sequence in order (or ring attention's block of it);
 * lse [B, H, tq]. Query i sees keys 0 .. q_pos[i]; at -1 it sees none: its
 * out row is 0 and its lse -inf, and backward gives it a dq row of 0 and
 * takes nothing from it to dk, dv (its dout, out and lse are not read).
 * dq [B, tq, H, D]; dk, dv [B, tk, Hkv, D] the whole sequence's,
 * overwritten. fsdp_attention_pos_check: FSDP_EINVAL, naming the query,
 * unless every q_pos is in [-1, tk). */
int fsdp_attention_pos_check(const int32_t *q_pos, int64_t tq, int64_t tk);
int fsdp_attention_forward_pos(float *out, float *lse, const float *q, const float *k, const float *v,
                               const int32_t *q_pos, int64_t batch, int64_t tq, int64_t tk, int64_t heads,
                               int64_t kv_heads, int64_t head_dim);
int fsdp_attention_backward_pos(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                                const float *v, const float *out, const float *lse, const int32_t *q_pos, int64_t batch,
                                int64_t tq, int64_t tk, int64_t heads, int64_t kv_heads, int64_t head_dim);
/* the _pos calls with packed rows (context parallelism over documents,
 * src/ops/attention_pos_docs.c): query i of batch row b sees keys
 * q_lo[b, i] .. q_pos[i] of the tk (q_lo [B, tq], each in [0, q_pos[i] +
 * 1]; q_lo = q_pos + 1 sees none: out 0, lse -inf, dq 0, nothing to dk,
 * dv, as q_pos -1); within a run of queries whose positions rise by one,
 * q_lo never falls. fsdp_attention_pos_docs_check: FSDP_EINVAL naming the
 * batch row and query otherwise. */
int fsdp_attention_pos_docs_check(const int32_t *q_pos, const int32_t *q_lo, int64_t batch, int64_t tq, int64_t tk);
int fsdp_attention_forward_pos_docs(float *out, float *lse, const float *q, const float *k, const float *v,
                                    const int32_t *q_pos, const int32_t *q_lo, int64_t batch, int64_t tq, int64_t tk,
                                    int64_t heads, int64_t kv_heads, int64_t head_dim);
int fsdp_attention_backward_pos_docs(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                     const float *k, const float *v, const float *out, const float *lse,
                                     const int32_t *q_pos, const int32_t *q_lo, int64_t batch, int64_t tq, int64_t tk,
                                     int64_t heads, int64_t kv_heads, int64_t head_dim);
/* Ring attention's combine (context parallelism, src/ops/attention_merge.c):
 * merges a partial result, attention over one block of keys (out_b [B, T,
 * H, D], lse_b [B, H, T]: the layouts of fsdp_attention_forward, lse the
 * natural log of the sum of exp(score) over the keys seen; a row that saw
 * none has lse -inf), into the accumulator (out, lse), in place, per row:
 *   m = max(lse, lse_b); a = exp(lse - m), b = exp(lse_b - m);
 *   out = (a out + b out_b) / (a + b); lse = m + log(a + b).
 * Where lse_b is -inf the row stays as it is (both -inf included); where
 * only lse is -inf it becomes the partial's (out_b, lse_b), bit for bit.
 * The out row of a side whose lse is -inf is not read. */
int fsdp_attention_merge(float *out, float *lse, const float *out_b, const float *lse_b, int64_t batch, int64_t seq,
                         int64_t heads, int64_t head_dim);
/* rope at given positions: pos [batch, seq], each in [0, seq) (a row of
 * the tables; packed rows: t - doc_start[t]) */
int fsdp_rope_forward_at(float *x, const float *cos_t, const float *sin_t, const int32_t *pos, int64_t batch, int64_t seq,
                         int64_t heads, int64_t head_dim);
int fsdp_rope_backward_at(float *dx, const float *cos_t, const float *sin_t, const int32_t *pos, int64_t batch,
                          int64_t seq, int64_t heads, int64_t head_dim);
/* generation: the queries of positions pos .. pos + tq - 1 (q, out [B, tq, H, D]) against
 * a KV cache (k_cache, v_cache [B, cap, Hkv, D]) that already holds positions 0 .. pos + tq - 1;
 * each query sees the keys up to its own position (src/ops/attention_cached.c) */
int fsdp_attention_cached(float *out, const float *q, const float *k_cache, const float *v_cache, int64_t batch,
                          int64_t tq, int64_t pos, int64_t cap, int64_t heads, int64_t kv_heads, int64_t head_dim);
/* y = silu(gate) * up */
int fsdp_swiglu_forward(float *y, const float *gate, const float *up, int64_t n);
/* dgate, dup overwritten */
int fsdp_swiglu_backward(float *dgate, float *dup, const float *dy, const float *gate, const float *up, int64_t n);
/* y = a + b (y may alias a or b) */
int fsdp_add(float *y, const float *a, const float *b, int64_t n);
/* y += alpha x */
int fsdp_scale_add(float *y, float alpha, const float *x, int64_t n);
/* loss_sum, count over rows whose target is not ignore_index; dlogits (may be
 * NULL, may alias logits) = grad_scale (softmax - onehot), 0 on ignored rows */
int fsdp_cross_entropy(double *loss_sum, int64_t *count, float *dlogits, const float *logits, const int32_t *targets,
                       int64_t n, int64_t vocab, int32_t ignore_index, float grad_scale);
/* cross_entropy over logits split by vocabulary (src/ops/cross_entropy_vocab.c):
 * this rank holds columns [first, first + cols) of each row. stats: each
 * row's local max and its target's logit (0 where another rank holds it);
 * the caller takes the max and the sum over the ranks; sum: sum exp(x - max)
 * over the local columns (summed over the ranks next); finish: the loss
 * (every rank the same) and dlogits (may be NULL, may alias logits) =
 * grad_scale (softmax - onehot) over the local columns */
int fsdp_cross_entropy_vocab_stats(float *row_max, float *target_logit, const float *logits, const int32_t *targets,
                                   int64_t n, int64_t vocab, int64_t first, int64_t cols, int32_t ignore_index);
int fsdp_cross_entropy_vocab_sum(float *sum, const float *logits, const float *row_max, int64_t n, int64_t cols);
int fsdp_cross_entropy_vocab_finish(double *loss_sum, int64_t *count, float *dlogits, const float *logits,
                                    const int32_t *targets, const float *row_max, const float *sum,
                                    const float *target_logit, int64_t n, int64_t vocab, int64_t first, int64_t cols,
                                    int32_t ignore_index, float grad_scale);
/* per row whose target is not ignore_index: logp = log softmax(logits)[t],
 * entropy = -sum p log p (each may be NULL), and with coef (dL/dlogp per
 * row) dlogits = coef (onehot(t) - softmax) (may be NULL, may alias
 * logits); ignored rows get 0 (src/ops/token_logprobs.c) */
int fsdp_token_logprobs(float *logp, float *entropy, float *dlogits, const float *logits, const int32_t *targets,
                        const float *coef, int64_t n, int64_t vocab, int32_t ignore_index);
/* token_logprobs over logits split by vocabulary (src/ops/token_logprobs_vocab.c),
 * after fsdp_cross_entropy_vocab_stats and the group's max and target logit:
 * sums: sum[i] = sum_j exp(x_ij - max_i) and, xsum non-NULL, xsum[i] =
 * sum_j exp(x_ij - max_i) (x_ij - max_i) over the local columns (the caller
 * sums both over the ranks); finish: logp = target_logit - (max + log sum),
 * entropy = log sum - xsum / sum (each may be NULL; entropy needs xsum),
 * dlogits (may be NULL, may alias logits; needs coef) = coef (onehot(t) -
 * exp(x - max) / sum) over the local columns; ignored rows get 0 in all three */
int fsdp_token_logprobs_vocab_sums(float *sum, float *xsum, const float *logits, const float *row_max, int64_t n,
                                   int64_t cols);
int fsdp_token_logprobs_vocab_finish(float *logp, float *entropy, float *dlogits, const float *logits,
                                     const int32_t *targets, const float *coef, const float *row_max, const float *sum,
                                     const float *xsum, const float *target_logit, int64_t n, int64_t vocab,
                                     int64_t first, int64_t cols, int32_t ignore_index);

/* ---- which OpenBLAS kernels the CPU GEMMs run on (src/ops/blas_core.c) - */
/* The core OpenBLAS runs ("Haswell", "Prescott", ...). */
const char *fsdp_blas_core(void);
/* The core this CPU's features call for, where OpenBLAS chose a lower one
 * and no OPENBLAS_CORETYPE is set; NULL: keep OpenBLAS's. */
const char *fsdp_blas_core_choice(void);
/* The core for these features: AVX-512 (F/BW/DQ/VL) SkylakeX, AVX2 + FMA
 * Haswell, AVX Sandybridge, else NULL. */
const char *fsdp_blas_core_for_features(int avx, int avx2_fma, int avx512);
/* 0 (SSE) to 3 (AVX-512); -1 for a core it does not rank. */
int fsdp_blas_core_level(const char *core);
/* One line: the kernels in use and who chose them. */
const char *fsdp_blas_core_note(void);
/* A GEMM on the kernels in use against float64; FSDP_EINVAL, with a
 * message naming the kernels, when they compute wrong results. */
int fsdp_blas_verify(void);

#ifdef __cplusplus
}
#endif
#endif /* FSDP_OPS_API_H */
