/* fsdp_kernels.h: the kernels' API (kernels/): the CUDA twins of the ops,
 * and the optimizer steps on device shards. The kernels are a library of
 * the device level, inside the CUDA backend (libfsdp_cuda.so): the device
 * layer, the NCCL transport and the units' steps run them, so they sit
 * below dist and shard. Part of the public API: included by fsdp.h, read
 * by ffi.lua, FFI-clean like it. */
#ifndef FSDP_KERNELS_API_H
#define FSDP_KERNELS_API_H

#include "fsdp_device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the CUDA twins (kernels/, one file per op family) ---------------
 * The same math as the CPU ops above, on device memory: activations,
 * weights and their grads in `dtype` (FSDP_FP32 or FSDP_BF16), statistics
 * (rstd, lse) in fp32, arithmetic in fp32. Asynchronous on s (NULL: the
 * default stream): argument errors return at once, faults inside a kernel
 * at the stream's next synchronize. Ids and targets must be valid: check
 * them on the host (a bad id gives zeros, not an error). Built with the
 * CUDA backend only (the symbols are absent otherwise). */
int fsdp_cuda_linear_forward(void *y, const void *x, const void *w, const void *b, int64_t n, int64_t in, int64_t out,
                             fsdp_dtype dtype, fsdp_stream *s);
int fsdp_cuda_linear_backward(void *dx, void *dw, void *db, const void *dy, const void *x, const void *w, int64_t n,
                              int64_t in, int64_t out, fsdp_dtype dtype, fsdp_stream *s);
int fsdp_cuda_embedding_forward(void *y, const int32_t *ids, const void *table, int64_t n, int64_t vocab, int64_t dim,
                                fsdp_dtype dtype, fsdp_stream *s);
int fsdp_cuda_embedding_backward(void *dtable, const void *dy, const int32_t *ids, int64_t n, int64_t vocab, int64_t dim,
                                 fsdp_dtype dtype, fsdp_stream *s);
/* a vocab-parallel slice of the table, rows [first, first + rows) of vocab,
 * as fsdp_embedding_forward_slice / _backward_slice (fsdp_ops.h): the ids
 * outside it give zero rows and no gradient */
int fsdp_cuda_embedding_forward_slice(void *y, const int32_t *ids, const void *table, int64_t n, int64_t vocab,
                                      int64_t first, int64_t rows, int64_t dim, fsdp_dtype dtype, fsdp_stream *s);
int fsdp_cuda_embedding_backward_slice(void *dtable, const void *dy, const int32_t *ids, int64_t n, int64_t vocab,
                                       int64_t first, int64_t rows, int64_t dim, fsdp_dtype dtype, fsdp_stream *s);
int fsdp_cuda_rmsnorm_forward(void *y, float *rstd, const void *x, const void *w, int64_t n, int64_t dim, float eps,
                              fsdp_dtype dtype, fsdp_stream *s);
int fsdp_cuda_rmsnorm_backward(void *dx, void *dw, const void *dy, const void *x, const void *w, const float *rstd,
                               int64_t n, int64_t dim, fsdp_dtype dtype, fsdp_stream *s);
int fsdp_cuda_rope_forward(void *x, const float *cos_t, const float *sin_t, int64_t batch, int64_t seq, int64_t heads,
                           int64_t head_dim, fsdp_dtype dtype, fsdp_stream *s);
int fsdp_cuda_rope_backward(void *dx, const float *cos_t, const float *sin_t, int64_t batch, int64_t seq, int64_t heads,
                            int64_t head_dim, fsdp_dtype dtype, fsdp_stream *s);
/* Which CUDA attention kernels run (process-wide; returns the previous
 * choice). AUTO: cuDNN's fused flash attention (kernels/attention_cudnn.cpp)
 * where it takes the call (bf16, head_dim a multiple of 8 up to 256,
 * libcudnn 9 loadable, a plan for the shape), else OWN. OWN: our
 * tensor-core kernels (kernels/attention_tc.cu) for bf16 with head_dim 64 or
 * 128 on compute capability 8.0+, else our fp32 CUDA-core kernels
 * (kernels/attention.cu). SIMPLE, TENSOR_CORES, CUDNN: always that family
 * (EUNSUPPORTED, with the reason, where it does not apply). The
 * environment's FSDP_ATTENTION=auto|own|cudnn|tc|simple sets the start. */
typedef enum {
  FSDP_ATTN_AUTO = 0,
  FSDP_ATTN_SIMPLE = 1,
  FSDP_ATTN_TENSOR_CORES = 2,
  FSDP_ATTN_CUDNN = 3,
  FSDP_ATTN_OWN = 4
} fsdp_attention_impl;
int fsdp_cuda_attention_impl_set(int which);
/* Which family a call of this shape would run (FSDP_ATTN_CUDNN,
 * _TENSOR_CORES or _SIMPLE, for aligned buffers on the current GPU), with
 * a line for the user in desc: the cuDNN version, or why not cuDNN.
 * backward: 0 forward, 1 backward. Builds cuDNN's plan if needed. */
int fsdp_cuda_attention_choice(fsdp_dtype dtype, int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                               int64_t head_dim, int backward, char *desc, size_t desc_len);
/* The device bytes a call of this shape takes from fsdp_alloc while it
 * runs, in *bytes: cuDNN's workspace where cuDNN runs it (its
 * deterministic backward holds fp32 partial sums of dq per block of keys:
 * about 1 GiB for 32 heads of 64 at sequence 4096), 0 for our kernels.
 * Returns the family, as fsdp_cuda_attention_choice does; fsdp.planner
 * counts the bytes in the activation peak. */
int fsdp_cuda_attention_workspace(fsdp_dtype dtype, int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                  int64_t head_dim, int backward, int64_t *bytes);
int fsdp_cuda_attention_forward(void *out, float *lse, const void *q, const void *k, const void *v, int64_t batch,
                                int64_t seq, int64_t heads, int64_t kv_heads, int64_t head_dim, fsdp_dtype dtype,
                                fsdp_stream *s);
int fsdp_cuda_attention_backward(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                                 const void *v, const void *out, const float *lse, int64_t batch, int64_t seq,
                                 int64_t heads, int64_t kv_heads, int64_t head_dim, fsdp_dtype dtype, fsdp_stream *s);
/* packed rows, as fsdp_attention_forward_docs (fsdp_ops.h): doc_start is
 * device memory [batch, seq], checked by the caller (fsdp_doc_start_check
 * on its host copy); our fp32 CUDA-core kernels (kernels/attention.cu)
 * run them whatever the impl setting */
int fsdp_cuda_attention_forward_docs(void *out, float *lse, const void *q, const void *k, const void *v,
                                     const int32_t *doc_start, int64_t batch, int64_t seq, int64_t heads,
                                     int64_t kv_heads, int64_t head_dim, fsdp_dtype dtype, fsdp_stream *s);
int fsdp_cuda_attention_backward_docs(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                                      const void *v, const void *out, const float *lse, const int32_t *doc_start,
                                      int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads, int64_t head_dim,
                                      fsdp_dtype dtype, fsdp_stream *s);
/* queries at given positions (context parallelism), as
 * fsdp_attention_forward_pos (fsdp_ops.h): q_pos [tq] is device memory,
 * checked by the caller (fsdp_attention_pos_check on its host copy); our
 * fp32 CUDA-core kernels run them whatever the impl setting */
int fsdp_cuda_attention_forward_pos(void *out, float *lse, const void *q, const void *k, const void *v,
                                    const int32_t *q_pos, int64_t batch, int64_t tq, int64_t tk, int64_t heads,
                                    int64_t kv_heads, int64_t head_dim, fsdp_dtype dtype, fsdp_stream *s);
int fsdp_cuda_attention_backward_pos(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                                     const void *v, const void *out, const float *lse, const int32_t *q_pos,
                                     int64_t batch, int64_t tq, int64_t tk, int64_t heads, int64_t kv_heads,
                                     int64_t head_dim, fsdp_dtype dtype, fsdp_stream *s);
/* queries at given positions from a first key each (packed rows under
 * context parallelism), as fsdp_attention_forward_pos_docs (fsdp_ops.h):
 * query i of batch row b sees keys q_lo[b, i] .. q_pos[i]; q_pos [tq] and
 * q_lo [batch, tq] are device memory, checked by the caller on their host
 * copies; our fp32 CUDA-core kernels (kernels/attention_pos.cu) run
 * them whatever the impl setting */
int fsdp_cuda_attention_forward_pos_docs(void *out, float *lse, const void *q, const void *k, const void *v,
                                         const int32_t *q_pos, const int32_t *q_lo, int64_t batch, int64_t tq,
                                         int64_t tk, int64_t heads, int64_t kv_heads, int64_t head_dim,
                                         fsdp_dtype dtype, fsdp_stream *s);
int fsdp_cuda_attention_backward_pos_docs(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                                          const void *v, const void *out, const float *lse, const int32_t *q_pos,
                                          const int32_t *q_lo, int64_t batch, int64_t tq, int64_t tk, int64_t heads,
                                          int64_t kv_heads, int64_t head_dim, fsdp_dtype dtype, fsdp_stream *s);
/* ring attention's combine, as fsdp_attention_merge (fsdp_ops.h): out,
 * out_b [B, T, H, D] in dtype; lse, lse_b [B, H, T] fp32; in place on
 * out and lse (kernels/attention_merge.cu) */
int fsdp_cuda_attention_merge(void *out, float *lse, const void *out_b, const float *lse_b, int64_t batch, int64_t seq,
                              int64_t heads, int64_t head_dim, fsdp_dtype dtype, fsdp_stream *s);
/* rope at positions pos [batch, seq] (device memory, each in [0, seq)) */
int fsdp_cuda_rope_forward_at(void *x, const float *cos_t, const float *sin_t, const int32_t *pos, int64_t batch,
                              int64_t seq, int64_t heads, int64_t head_dim, fsdp_dtype dtype, fsdp_stream *s);
int fsdp_cuda_rope_backward_at(void *dx, const float *cos_t, const float *sin_t, const int32_t *pos, int64_t batch,
                               int64_t seq, int64_t heads, int64_t head_dim, fsdp_dtype dtype, fsdp_stream *s);
/* generation's attention against a KV cache, as fsdp_attention_cached (fsdp_ops.h); head_dim <= 512 */
int fsdp_cuda_attention_cached(void *out, const void *q, const void *k_cache, const void *v_cache, int64_t batch,
                               int64_t tq, int64_t pos, int64_t cap, int64_t heads, int64_t kv_heads, int64_t head_dim,
                               fsdp_dtype dtype, fsdp_stream *s);
int fsdp_cuda_swiglu_forward(void *y, const void *gate, const void *up, int64_t n, fsdp_dtype dtype, fsdp_stream *s);
int fsdp_cuda_swiglu_backward(void *dgate, void *dup, const void *dy, const void *gate, const void *up, int64_t n,
                              fsdp_dtype dtype, fsdp_stream *s);
int fsdp_cuda_add(void *y, const void *a, const void *b, int64_t n, fsdp_dtype dtype, fsdp_stream *s);
int fsdp_cuda_scale_add(void *y, float alpha, const void *x, int64_t n, fsdp_dtype dtype, fsdp_stream *s);
/* loss_sum (double) and count (int64) are device memory, zeroed first */
int fsdp_cuda_cross_entropy(double *loss_sum, int64_t *count, void *dlogits, const void *logits, const int32_t *targets,
                            int64_t n, int64_t vocab, int32_t ignore_index, float grad_scale, fsdp_dtype dtype,
                            fsdp_stream *s);
/* the cross-entropy of logits split over the vocabulary, as the
 * fsdp_cross_entropy_vocab_* passes (fsdp_ops.h): logits (and dlogits,
 * which may alias them) fp32 or bf16, the stats fp32, all device memory.
 * combine: gathered holds each of `ranks` ranks' stats ({ranks, 2n}: n
 * maxima, then n target logits), the group's go into row_max and
 * target_logit (the max; the sum, which only the target's owner makes
 * nonzero). finish: loss_sum (double) and count (int64), device memory,
 * are zeroed first. */
int fsdp_cuda_cross_entropy_vocab_stats(float *row_max, float *target_logit, const void *logits, const int32_t *targets,
                                        int64_t n, int64_t vocab, int64_t first, int64_t cols, int32_t ignore_index,
                                        fsdp_dtype dtype, fsdp_stream *s);
int fsdp_cuda_cross_entropy_vocab_combine(float *row_max, float *target_logit, const float *gathered, int64_t n, int ranks,
                                          fsdp_stream *s);
int fsdp_cuda_cross_entropy_vocab_sum(float *sum, const void *logits, const float *row_max, int64_t n, int64_t cols,
                                      fsdp_dtype dtype, fsdp_stream *s);
int fsdp_cuda_cross_entropy_vocab_finish(double *loss_sum, int64_t *count, void *dlogits, const void *logits,
                                         const int32_t *targets, const float *row_max, const float *sum,
                                         const float *target_logit, int64_t n, int64_t vocab, int64_t first,
                                         int64_t cols, int32_t ignore_index, float grad_scale, fsdp_dtype dtype,
                                         fsdp_stream *s);
/* as the fsdp_token_logprobs_vocab_* passes (fsdp_ops.h), after
 * fsdp_cuda_cross_entropy_vocab_stats and _combine: logits (and dlogits,
 * which may alias them) fp32 or bf16, everything else fp32, all device
 * memory; a target outside [0, vocab) is taken as ignored (the caller
 * checks them on the host) */
int fsdp_cuda_token_logprobs_vocab_sums(float *sum, float *xsum, const void *logits, const float *row_max, int64_t n,
                                        int64_t cols, fsdp_dtype dtype, fsdp_stream *s);
int fsdp_cuda_token_logprobs_vocab_finish(float *logp, float *entropy, void *dlogits, const void *logits,
                                          const int32_t *targets, const float *coef, const float *row_max,
                                          const float *sum, const float *xsum, const float *target_logit, int64_t n,
                                          int64_t vocab, int64_t first, int64_t cols, int32_t ignore_index,
                                          fsdp_dtype dtype, fsdp_stream *s);
/* as fsdp_token_logprobs (fsdp_ops.h): logits fp32 or bf16 (dlogits in
 * their dtype, may alias them); logp, entropy, coef fp32; all device memory */
int fsdp_cuda_token_logprobs(float *logp, float *entropy, void *dlogits, const void *logits, const int32_t *targets,
                             const float *coef, int64_t n, int64_t vocab, int32_t ignore_index, fsdp_dtype dtype,
                             fsdp_stream *s);
/* optimizers on flat fp32 device shards; out (may be NULL) gets the new
 * values in out_dtype in the same pass (bf16: ties away from zero). Split
 * params (low not NULL, param NULL, out bf16): each fp32 param is out[i]
 * and low[i] (base/bf16_split.h), both read and written. The grads are
 * grad_dtype: fp32, or bf16 where a unit keeps them so. */
int fsdp_cuda_adamw_step(float *param, void *out, fsdp_dtype out_dtype, uint16_t *low, const void *grad,
                         fsdp_dtype grad_dtype, float *m, float *v, int64_t n, int64_t step, const fsdp_adamw_config *cfg, float grad_scale,
                         fsdp_stream *s);
int fsdp_cuda_sgd_step(float *param, void *out, fsdp_dtype out_dtype, uint16_t *low, const void *grad,
                       fsdp_dtype grad_dtype, float *momentum, int64_t n, int64_t step, float lr, float mu, float weight_decay,
                       float grad_scale, fsdp_stream *s);
/* adds into the device counters sum (double) and nonfinite (int64); x is
 * fp32 or bf16 */
int fsdp_cuda_sum_squares(const void *x, fsdp_dtype dtype, int64_t n, double *sum, int64_t *nonfinite, fsdp_stream *s);

#ifdef __cplusplus
}
#endif
#endif /* FSDP_KERNELS_API_H */
