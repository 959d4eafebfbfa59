/* attention_impl.h: the three families of CUDA attention kernels as the
 * dispatch (attention_choice.cu) calls them: cuDNN's fused flash attention
 * (attention_cudnn.h), our tensor-core kernels (attention_tc.h) and our
 * fp32 CUDA-core kernels (below, attention.cu). Same layouts and lse for
 * all: q, out, dq, dout [B, T, H, D]; k, v, dk, dv [B, T, Hkv, D];
 * lse [B, H, T], the natural-log log-sum-exp of the scaled scores. */
#ifndef FSDP_KERNELS_ATTENTION_IMPL_H
#define FSDP_KERNELS_ATTENTION_IMPL_H

#include <stdint.h>

#include "attention_cudnn.h"
#include "attention_tc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* the arguments every family accepts (else FSDP_EINVAL naming `what`) */
int fsdp_attention_check_args(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int32_t dtype, const char *what);
/* the fp32 CUDA-core kernels: fp32 or bf16, any head_dim up to 256;
 * doc_start [B, T] on the device (packed rows: query i sees keys
 * doc_start[i] .. i) or NULL (causal) */
int fsdp_attention_simple_forward(void *out, float *lse, const void *q, const void *k, const void *v,
                                  const int32_t *doc_start, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                                  int32_t dtype, void *stream);
int fsdp_attention_simple_backward(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                                   const void *v, const void *out, const float *lse, const int32_t *doc_start, int64_t B,
                                   int64_t T, int64_t H, int64_t Hkv, int64_t D, int32_t dtype, void *stream);
/* queries at positions q_pos [T] (device memory, each in [0, Tk)) of Tk
 * keys, query i seeing keys 0 .. q_pos[i]: k, v, dk, dv [B, Tk, Hkv, D] */
int fsdp_attention_simple_forward_pos(void *out, float *lse, const void *q, const void *k, const void *v,
                                      const int32_t *q_pos, int64_t B, int64_t T, int64_t Tk, int64_t H, int64_t Hkv,
                                      int64_t D, int32_t dtype, void *stream);
int fsdp_attention_simple_backward_pos(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                                       const void *v, const void *out, const float *lse, const int32_t *q_pos,
                                       int64_t B, int64_t T, int64_t Tk, int64_t H, int64_t Hkv, int64_t D,
                                       int32_t dtype, void *stream);

#ifdef __cplusplus
}
#endif
#endif
