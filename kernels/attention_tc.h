/* attention_tc.h: the tensor-core attention kernels (attention_tc.cu), as
 * attention.cu calls them. bf16 only; head_dim 64 or 128. */
#ifndef FSDP_KERNELS_ATTENTION_TC_H
#define FSDP_KERNELS_ATTENTION_TC_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the tensor-core kernels take this call: bf16, head_dim 64 or 128,
 * every pointer 16-byte aligned, a GPU of compute capability 8.0 or newer
 * with enough shared memory per block */
int fsdp_attention_tc_applies(int32_t dtype, int64_t head_dim, const void *const *ptrs, int nptrs);
int fsdp_attention_tc_forward(void *out, float *lse, const void *q, const void *k, const void *v, int64_t B, int64_t T,
                              int64_t H, int64_t Hkv, int64_t D, void *stream);
int fsdp_attention_tc_backward(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                               const void *v, const void *out, const float *lse, int64_t B, int64_t T, int64_t H,
                               int64_t Hkv, int64_t D, void *stream);

#ifdef __cplusplus
}
#endif
#endif
