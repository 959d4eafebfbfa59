/* fsdp_ops.h: forward and backward of the model's operations (src/ops/ on
 * CPU, kernels/ on CUDA). Part of the public API: included by fsdp.h, read
 * by ffi.lua, FFI-clean like it (no macros in declarations). */
#ifndef FSDP_OPS_API_H
#define FSDP_OPS_API_H

#include <stddef.h>
#include <stdint.h>

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

/* ---- the CUDA twins (kernels/, one file per op family) ---------------
 * The same math as the CPU ops above, on device memory: activations,
 * weights and their grads in `dtype` (FSDP_FP32 or FSDP_BF16), statistics
 * (rstd, lse) in fp32, arithmetic in fp32. Asynchronous on s (NULL: the
 * default stream): argument errors return at once, faults inside a kernel
 * at the stream's next synchronize. Ids and targets must be valid: check
 * them on the host (a bad id gives zeros, not an error). Built with the
 * CUDA backend only (the symbols are absent otherwise). fsdp_stream and
 * fsdp_adamw_config come from fsdp.h, which includes this file. */
int fsdp_cuda_linear_forward(void *y, const void *x, const void *w, const void *b, int64_t n, int64_t in, int64_t out,
                             int32_t dtype, fsdp_stream *s);
int fsdp_cuda_linear_backward(void *dx, void *dw, void *db, const void *dy, const void *x, const void *w, int64_t n,
                              int64_t in, int64_t out, int32_t dtype, fsdp_stream *s);
int fsdp_cuda_embedding_forward(void *y, const int32_t *ids, const void *table, int64_t n, int64_t vocab, int64_t dim,
                                int32_t dtype, fsdp_stream *s);
int fsdp_cuda_embedding_backward(void *dtable, const void *dy, const int32_t *ids, int64_t n, int64_t vocab, int64_t dim,
                                 int32_t dtype, fsdp_stream *s);
int fsdp_cuda_rmsnorm_forward(void *y, float *rstd, const void *x, const void *w, int64_t n, int64_t dim, float eps,
                              int32_t dtype, fsdp_stream *s);
int fsdp_cuda_rmsnorm_backward(void *dx, void *dw, const void *dy, const void *x, const void *w, const float *rstd,
                               int64_t n, int64_t dim, int32_t dtype, fsdp_stream *s);
int fsdp_cuda_rope_forward(void *x, const float *cos_t, const float *sin_t, int64_t batch, int64_t seq, int64_t heads,
                           int64_t head_dim, int32_t dtype, fsdp_stream *s);
int fsdp_cuda_rope_backward(void *dx, const float *cos_t, const float *sin_t, int64_t batch, int64_t seq, int64_t heads,
                            int64_t head_dim, int32_t dtype, fsdp_stream *s);
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
int fsdp_cuda_attention_choice(int32_t dtype, int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                               int64_t head_dim, int backward, char *desc, size_t desc_len);
int fsdp_cuda_attention_forward(void *out, float *lse, const void *q, const void *k, const void *v, int64_t batch,
                                int64_t seq, int64_t heads, int64_t kv_heads, int64_t head_dim, int32_t dtype,
                                fsdp_stream *s);
int fsdp_cuda_attention_backward(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                                 const void *v, const void *out, const float *lse, int64_t batch, int64_t seq,
                                 int64_t heads, int64_t kv_heads, int64_t head_dim, int32_t dtype, fsdp_stream *s);
int fsdp_cuda_swiglu_forward(void *y, const void *gate, const void *up, int64_t n, int32_t dtype, fsdp_stream *s);
int fsdp_cuda_swiglu_backward(void *dgate, void *dup, const void *dy, const void *gate, const void *up, int64_t n,
                              int32_t dtype, fsdp_stream *s);
int fsdp_cuda_add(void *y, const void *a, const void *b, int64_t n, int32_t dtype, fsdp_stream *s);
int fsdp_cuda_scale_add(void *y, float alpha, const void *x, int64_t n, int32_t dtype, fsdp_stream *s);
/* loss_sum (double) and count (int64) are device memory, zeroed first */
int fsdp_cuda_cross_entropy(double *loss_sum, int64_t *count, void *dlogits, const void *logits, const int32_t *targets,
                            int64_t n, int64_t vocab, int32_t ignore_index, float grad_scale, int32_t dtype,
                            fsdp_stream *s);
/* optimizers on flat fp32 device shards; out (may be NULL) gets the new
 * values in out_dtype in the same pass */
int fsdp_cuda_adamw_step(float *param, void *out, int32_t out_dtype, const float *grad, float *m, float *v, int64_t n,
                         int64_t step, const fsdp_adamw_config *cfg, float grad_scale, fsdp_stream *s);
int fsdp_cuda_sgd_step(float *param, void *out, int32_t out_dtype, const float *grad, float *momentum, int64_t n,
                       int64_t step, float lr, float mu, float weight_decay, float grad_scale, fsdp_stream *s);
/* adds into the device counters sum (double) and nonfinite (int64) */
int fsdp_cuda_sum_squares(const float *x, int64_t n, double *sum, int64_t *nonfinite, fsdp_stream *s);

#endif /* FSDP_OPS_API_H */
