/* attention_cudnn.h: causal grouped-query attention through cuDNN's fused
 * flash attention (attention_cudnn.cpp), as attention.cu calls it. bf16 in
 * and out, fp32 softmax statistics (the same log-sum-exp as our kernels'
 * lse, so either side's backward can use the other's forward). Built only
 * where the cuDNN frontend headers were found; without them every call
 * says so (attention_cudnn_none.c). libcudnn is loaded on first use. */
#ifndef FSDP_KERNELS_ATTENTION_CUDNN_H
#define FSDP_KERNELS_ATTENTION_CUDNN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when cuDNN takes a call of this shape: libcudnn 9 loads and cuDNN
 * built a plan for the shape on the current GPU; 0 otherwise, with the
 * reason in why (may be NULL). The answer is cached with the plan.
 * backward: 0 forward, 1 backward (each has its own plan). The caller has
 * checked what cuDNN's kernels need of the arguments: bf16, head_dim a
 * multiple of 8 up to 256, 16-byte aligned buffers (attention_choice.cu). */
int fsdp_attention_cudnn_applies(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int backward, char *why,
                                 size_t why_len);
int fsdp_attention_cudnn_forward(void *out, float *lse, const void *q, const void *k, const void *v, int64_t B,
                                 int64_t T, int64_t H, int64_t Hkv, int64_t D, void *stream);
int fsdp_attention_cudnn_backward(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                                  const void *v, const void *out, const float *lse, int64_t B, int64_t T, int64_t H,
                                  int64_t Hkv, int64_t D, void *stream);
/* The bytes a call of this shape takes from fsdp_alloc while it runs (its
 * plan's workspace), or -1 where cuDNN does not take the shape. */
int64_t fsdp_attention_cudnn_workspace(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int backward);
/* "cuDNN 9.19.0 (frontend 1.32.0)", or why there is none */
const char *fsdp_attention_cudnn_version(void);

#ifdef __cplusplus
}
#endif
#endif
