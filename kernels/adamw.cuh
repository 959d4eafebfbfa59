// adamw.cuh: the optimizer kernels' source, shared by nvcc (adamw.cu) and
// tests/emu/test_adamw_emu.cpp, which runs them on the CPU under
// tests/emu/cuda_emu.h against the host's element update, bit for bit.
// AdamW and SGD over a flat fp32 shard, or over split params (the bf16
// copy's high halves plus low halves: src/base/bf16_split.h), writing the
// compute-dtype copy in the same pass; the grads G are fp32, or bf16 where
// a unit keeps them so. The includer provides ld(p, i) and
// st_param(p, i, v) for float and __nv_bfloat16 (st_param's bf16: ties away
// from zero, the params' rule).
#ifndef FSDP_KERNELS_ADAMW_CUH
#define FSDP_KERNELS_ADAMW_CUH

#include "../src/base/adamw_math.h"
#include "../src/base/bf16_split.h"

namespace fsdp_opt {

// The fp32 param i: its own array, or (low set: out is bf16) joined from halves.
template <typename T>
__device__ __forceinline__ float ld_param(const float *param, const T *out, const uint16_t *low, int64_t i) {
  return low ? fsdp_bf16_join(reinterpret_cast<const uint16_t *>(out)[i], low[i]) : param[i];
}
__device__ __forceinline__ void st_main(float *param, uint16_t *low, int64_t i, float v) {
  if (low) low[i] = fsdp_bf16_low(v);
  else param[i] = v;
}

template <typename T, typename G>
__global__ void adamw_kernel(float *param, T *out, uint16_t *low, const G *grad, float *m, float *v, int64_t n,
                             float b1, float b2, float lr, float eps, float decay, float c1, float c2, float grad_scale) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float p = ld_param(param, out, low, i);
    fsdp_adamw_element(&p, m + i, v + i, ld(grad, i) * grad_scale, b1, b2, lr, eps, decay, c1, c2);
    st_main(param, low, i, p);
    if (out) st_param(out, i, p);
  }
}

template <typename T, typename G>
__global__ void sgd_kernel(float *param, T *out, uint16_t *low, const G *grad, float *mom, int64_t n, int first,
                           float lr, float mu, float wd, float grad_scale) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float p = ld_param(param, out, low, i);
    float g = ld(grad, i) * grad_scale + wd * p;
    if (mu != 0.0f) {
      mom[i] = first ? g : mu * mom[i] + g;
      g = mom[i];
    }
    p -= lr * g;
    st_main(param, low, i, p);
    if (out) st_param(out, i, p);
  }
}

}  // namespace fsdp_opt

#endif
