// adamw.cu: the CUDA twin of src/shard/adamw.c: AdamW and SGD over a flat
// fp32 shard (or split params: the bf16 copy plus low halves; fp32 or bf16
// grads), writing the compute-dtype copy (bf16 or fp32) in the same pass,
// and the sum of squares / non-finite count for the global grad norm.
#include <math.h>

#include "common.cuh"

using namespace fsdpk;

#include "adamw.cuh"

using fsdp_opt::adamw_kernel;
using fsdp_opt::sgd_kernel;

// split params: bf16 high halves in out, no fp32 array; else an fp32 array
static int check_params(const char *who, const float *param, const void *out, fsdp_dtype out_dtype, const uint16_t *low) {
  if (low && (param || !out || out_dtype != FSDP_BF16))
    return fsdp_fail(FSDP_EINVAL, "%s: split params take bf16 high halves (out) and low ones, no fp32 array", who);
  if (!low && !param) return fsdp_fail(FSDP_EINVAL, "%s: NULL param buffer", who);
  return FSDP_OK;
}

template <typename G>
__global__ void sum_squares_kernel(const G *x, int64_t n, double *sum, unsigned long long *nonfinite) {
  float acc = 0, bad = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float v = ld(x, i);
    if (isfinite(v)) acc += v * v;
    else bad += 1.0f;
  }
  acc = block_reduce(acc, Sum());
  bad = block_reduce(bad, Sum());
  if (threadIdx.x == 0) {
    atomicAdd(sum, (double)acc);
    if (bad > 0) atomicAdd(nonfinite, (unsigned long long)bad);
  }
}

extern "C" int fsdp_cuda_adamw_step(float *param, void *out, fsdp_dtype out_dtype, uint16_t *low, const void *grad,
                                    fsdp_dtype grad_dtype, float *m, float *v, int64_t n, int64_t step, const fsdp_adamw_config *cfg,
                                    float grad_scale, fsdp_stream *s) {
  if (!cfg || n < 0 || step < 1)
    return fsdp_fail(FSDP_EINVAL, "cuda adamw: %s", !cfg ? "NULL config" : step < 1 ? "the first real step is 1" : "negative length");
  if (!(cfg->beta1 >= 0 && cfg->beta1 < 1 && cfg->beta2 >= 0 && cfg->beta2 < 1 && cfg->eps > 0 && cfg->lr >= 0 &&
        cfg->weight_decay >= 0))
    return fsdp_fail(FSDP_EINVAL, "cuda adamw: expected 0 <= beta1, beta2 < 1, eps > 0, lr >= 0, weight_decay >= 0");
  FSDP_CHECK(check_dtype(out_dtype, "cuda adamw"));
  FSDP_CHECK(check_dtype(grad_dtype, "cuda adamw (grads)"));
  if (n == 0) return FSDP_OK;
  FSDP_NEED_PTRS("cuda adamw", grad, m, v); /* out: optional */
  FSDP_CHECK(check_params("cuda adamw", param, out, out_dtype, low));
  // the bias corrections in double, as on the CPU
  float c1 = (float)(1.0 / (1.0 - pow(cfg->beta1, (double)step))), c2 = (float)(1.0 / (1.0 - pow(cfg->beta2, (double)step)));
  float decay = 1.0f - cfg->lr * cfg->weight_decay;
  FSDP_DISPATCH(out_dtype, T, FSDP_DISPATCH(grad_dtype, G, adamw_kernel<T, G><<<blocks_for(n, 256), 256, 0, stream_of(s)>>>(
                                  param, (T *)out, low, (const G *)grad, m, v, n, cfg->beta1, cfg->beta2, cfg->lr, cfg->eps,
                                  decay, c1, c2, grad_scale)));
  return launched("cuda adamw");
}

extern "C" int fsdp_cuda_sgd_step(float *param, void *out, fsdp_dtype out_dtype, uint16_t *low, const void *grad,
                                  fsdp_dtype grad_dtype, float *momentum, int64_t n, int64_t step, float lr, float mu, float weight_decay,
                                  float grad_scale, fsdp_stream *s) {
  if (n < 0 || step < 1 || (mu != 0 && !momentum && n)) return fsdp_fail(FSDP_EINVAL, "cuda sgd: bad arguments");
  FSDP_CHECK(check_dtype(out_dtype, "cuda sgd"));
  FSDP_CHECK(check_dtype(grad_dtype, "cuda sgd (grads)"));
  if (n == 0) return FSDP_OK;
  FSDP_NEED_PTRS("cuda sgd", grad);
  FSDP_CHECK(check_params("cuda sgd", param, out, out_dtype, low));
  FSDP_DISPATCH(out_dtype, T, FSDP_DISPATCH(grad_dtype, G, sgd_kernel<T, G><<<blocks_for(n, 256), 256, 0, stream_of(s)>>>(
                                  param, (T *)out, low, (const G *)grad, momentum, n, step == 1, lr, mu, weight_decay,
                                  grad_scale)));
  return launched("cuda sgd");
}

extern "C" int fsdp_cuda_sum_squares(const void *x, fsdp_dtype dtype, int64_t n, double *sum, int64_t *nonfinite,
                                     fsdp_stream *s) {
  if (n < 0 || !sum || !nonfinite) return fsdp_fail(FSDP_EINVAL, "cuda sum_squares: bad arguments");
  FSDP_CHECK(check_dtype(dtype, "cuda sum_squares"));
  if (n == 0) return FSDP_OK;
  FSDP_NEED_PTRS("cuda sum_squares", x);
  unsigned blocks = blocks_for(n, 256);
  if (blocks > 1024) blocks = 1024;
  FSDP_DISPATCH(dtype, G, sum_squares_kernel<G><<<blocks, 256, 0, stream_of(s)>>>((const G *)x, n, sum,
                                                                               (unsigned long long *)nonfinite));
  return launched("cuda sum_squares");
}
