// cross_entropy.cu: the CUDA twin of cross_entropy.c, fused: one block per
// row reads the logits for the max and the sum of exponentials (fp32), adds
// the row's loss to a device double, and writes the gradient over the
// logits in the same storage (bf16 logits never exist in fp32 in memory).
#include "common.cuh"

using namespace fsdpk;

template <typename T>
__global__ void cross_entropy_kernel(double *loss_sum, unsigned long long *count, T *dlogits, const T *logits,
                                     const int32_t *targets, int64_t vocab, int32_t ignore_index, float grad_scale) {
  int64_t row = blockIdx.x;
  const T *x = logits + row * vocab;
  T *d = dlogits ? dlogits + row * vocab : nullptr;
  int32_t t = targets[row];
  if (t == ignore_index || t < 0 || t >= vocab) {  // bad targets are refused on the host
    for (int64_t j = threadIdx.x; d && j < vocab; j += blockDim.x) st(d, j, 0.0f);
    return;
  }
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) m = fmaxf(m, ld(x, j));
  m = block_reduce(m, Max());
  float s = 0;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) s += __expf(ld(x, j) - m);
  s = block_reduce(s, Sum());
  float lse = m + logf(s);
  float xt = ld(x, t);
  __syncthreads();  // every thread has read x[t] before the gradient overwrites it (in place)
  if (threadIdx.x == 0) {
    atomicAdd(loss_sum, (double)(lse - xt));
    atomicAdd(count, 1ull);
  }
  for (int64_t j = threadIdx.x; d && j < vocab; j += blockDim.x)
    st(d, j, grad_scale * (__expf(ld(x, j) - lse) - (j == t ? 1.0f : 0.0f)));
}

extern "C" int fsdp_cuda_cross_entropy(double *loss_sum, int64_t *count, void *dlogits, const void *logits,
                                       const int32_t *targets, int64_t n, int64_t vocab, int32_t ignore_index,
                                       float grad_scale, int32_t dtype, fsdp_stream *s) {
  if (n < 0 || vocab < 1 || n > 2147483647 || !loss_sum || !count)
    return fsdp_fail(FSDP_EINVAL, "cuda cross_entropy: n = %lld, vocab = %lld, device sums %s", (long long)n,
                     (long long)vocab, loss_sum && count ? "given" : "missing");
  FSDP_CHECK(check_dtype(dtype, "cuda cross_entropy"));
  if (n > 0) FSDP_NEED_PTRS("cuda cross_entropy", logits, targets); /* dlogits: optional */
  cudaStream_t st_ = stream_of(s);
  if (cudaMemsetAsync(loss_sum, 0, sizeof(double), st_) != cudaSuccess || cudaMemsetAsync(count, 0, sizeof(int64_t), st_) != cudaSuccess)
    return launched("cuda cross_entropy");
  if (n == 0) return FSDP_OK;
  FSDP_DISPATCH(dtype, T, cross_entropy_kernel<T><<<(unsigned)n, 1024, 0, st_>>>(
                              loss_sum, (unsigned long long *)count, (T *)dlogits, (const T *)logits, targets, vocab,
                              ignore_index, grad_scale));
  return launched("cuda cross_entropy");
}
