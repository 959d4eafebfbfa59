/* kernels.h: C entry points of the CUDA kernels (the .cu files here). Each takes
 * the cudaStream_t as void * so that C files need no CUDA headers, and
 * returns a cudaError_t as int (0 = success). */
#ifndef FSDP_KERNELS_H
#define FSDP_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dst[i] = (float)src[i]; src_dtype is FSDP_BF16 or FSDP_FP16 (cast.cu) */
int fsdp_kernel_cast_to_f32(float *dst, const void *src, int src_dtype, size_t n, void *stream);
/* dst[r * cols + i] = (float)src[r * src_stride + i] for r < rows, i < cols */
int fsdp_kernel_cast_rows_to_f32(float *dst, const void *src, int src_dtype, size_t rows, size_t cols,
                                 size_t src_stride, void *stream);
/* dst[i] += (float)src[i]; src_dtype FSDP_FP32 or FSDP_BF16 (elementwise.cu) */
int fsdp_kernel_accumulate_f32(float *dst, const void *src, int src_dtype, size_t n, void *stream);
/* dst[i] = src[i] rounded to dst_dtype (FSDP_FP32 or FSDP_BF16; bf16 ties away
 * from zero, the params' rule: base/bf16_split.h) (elementwise.cu) */
int fsdp_kernel_cast_from_f32(void *dst, int dst_dtype, const float *src, size_t n, void *stream);
/* Occupies the stream for about `microseconds` (delay.cu): a testing aid. */
int fsdp_kernel_delay(int64_t microseconds, void *stream);

#ifdef __cplusplus
}
#endif
#endif
