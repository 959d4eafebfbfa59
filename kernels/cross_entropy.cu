// cross_entropy.cu: the CUDA twin of cross_entropy.c, fused: one block per
// row reads the logits once for the max and the sum of exponentials (fp32,
// online), adds the row's loss to a device double, and writes the gradient
// over the logits in the same storage (bf16 logits never exist in fp32 in
// memory). The kernel's source is cross_entropy.cuh (also run on the CPU
// by tests/emu/test_cross_entropy_emu.cpp).
#include "common.cuh"

using namespace fsdpk;

#define FSDP_CE_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
#include "cross_entropy.cuh"

extern "C" int fsdp_cuda_cross_entropy(double *loss_sum, int64_t *count, void *dlogits, const void *logits,
                                       const int32_t *targets, int64_t n, int64_t vocab, int32_t ignore_index,
                                       float grad_scale, fsdp_dtype dtype, fsdp_stream *s) {
  if (n < 0 || vocab < 1 || n > 2147483647 || !loss_sum || !count)
    return fsdp_fail(FSDP_EINVAL, "cuda cross_entropy: n = %lld, vocab = %lld, device sums %s", (long long)n,
                     (long long)vocab, loss_sum && count ? "given" : "missing");
  FSDP_CHECK(check_dtype(dtype, "cuda cross_entropy"));
  if (n > 0) FSDP_NEED_PTRS("cuda cross_entropy", logits, targets); /* dlogits: optional */
  cudaStream_t st_ = stream_of(s);
  if (cudaMemsetAsync(loss_sum, 0, sizeof(double), st_) != cudaSuccess || cudaMemsetAsync(count, 0, sizeof(int64_t), st_) != cudaSuccess)
    return launched("cuda cross_entropy");
  if (n == 0) return FSDP_OK;
  FSDP_DISPATCH(dtype, T, fsdp_ce::cross_entropy_kernel<T><<<(unsigned)n, 1024, 64 * sizeof(float), st_>>>(
                              loss_sum, (unsigned long long *)count, (T *)dlogits, (const T *)logits, targets, vocab,
                              ignore_index, grad_scale));
  return launched("cuda cross_entropy");
}
