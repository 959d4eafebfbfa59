// attention_tc.cu: causal grouped-query attention on tensor cores, bf16 in
// and out with fp32 accumulation, flash-attention-2 style (the T x T scores
// never exist in memory). attention.cu picks it for bf16, head_dim 64 or
// 128 on sm_80 and newer (fsdp_cuda_attention_impl_set overrides), and
// keeps its fp32 CUDA-core kernels for everything else; both are checked
// against the CPU op (tests/c/test_kernels.c) and timed side by side
// (bench/bench_kernels.c). The kernels themselves are in attention_tc.cuh,
// which tests/emu/test_attention_tc_emu.cpp also runs on the CPU.
//
// Forward: a block of 4 warps takes 64 query rows (16 per warp) and walks
// the key tiles up to the diagonal; per tile each warp computes S = Q K^T
// with WMMA into shared memory, updates its rows' running max and sum (two
// lanes per row), writes P in bf16 and rescales its fp32 output rows, then
// adds P V with WMMA. It saves the log-sum-exp for the backward.
// Backward: one kernel for dq (a block per 64 query rows, walking key
// tiles) and one for dk, dv (a block per 64 key rows, walking every query
// head of its group and the query tiles below the diagonal), so nothing
// needs atomics; both recompute P from the saved log-sum-exp, with
// Delta_i = dout_i . out_i from a small pre-pass.
// Layouts as attention.cu: q, out, dq, dout [B, T, H, D]; k, v, dk, dv
// [B, T, Hkv, D]; lse [B, H, T].
#include <mma.h>

#include "attention_tc.h"
#include "common.cuh"

using namespace fsdpk;
using namespace nvcuda;

#define FSDP_TC_SHARED(name) extern __shared__ __align__(128) unsigned char name[]

#include "attention_tc.cuh"

using namespace fsdp_tc;

namespace {

/* the GPU's compute capability and opt-in shared memory, asked once per
 * device (every attention call checks them) */
int device_ok(size_t smem) {
  static int known_dev = -1, major = 0, optin = 0;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  if (dev != known_dev) {
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    known_dev = dev;
  }
  return major >= 8 && (size_t)optin >= smem;
}

bool aligned(const void *p) { return ((uintptr_t)p & 15) == 0; }

} // namespace

extern "C" int fsdp_attention_tc_applies(int32_t dtype, int64_t head_dim, const void *const *ptrs, int nptrs) {
  if (dtype != FSDP_BF16 || (head_dim != 64 && head_dim != 128)) return 0;
  for (int i = 0; i < nptrs; i++)
    if (!aligned(ptrs[i])) return 0;
  size_t most = head_dim == 64 ? dkv_smem<64>() : dkv_smem<128>(), dq = head_dim == 64 ? dq_smem<64>() : dq_smem<128>();
  return device_ok(most > dq ? most : dq); /* the forward needs less than either */
}

template <int D>
static void fwd_launch(void *out, float *lse, const void *q, const void *k, const void *v, Geo g, cudaStream_t st) {
  dim3 grid((unsigned)((g.T + BR - 1) / BR), (unsigned)g.H, (unsigned)g.B);
  cudaFuncSetAttribute(fa_fwd<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fwd_smem<D>());
  fa_fwd<D><<<grid, THREADS, fwd_smem<D>(), st>>>((bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, g);
}

extern "C" int fsdp_attention_tc_forward(void *out, float *lse, const void *q, const void *k, const void *v, int64_t B,
                                         int64_t T, int64_t H, int64_t Hkv, int64_t D, void *stream) {
  Geo g = {B, T, H, Hkv, 1.0f / sqrtf((float)D)};
  cudaStream_t st = (cudaStream_t)stream;
  if (D == 64) fwd_launch<64>(out, lse, q, k, v, g, st);
  else fwd_launch<128>(out, lse, q, k, v, g, st);
  return launched("cuda attention forward (tensor cores)");
}

template <int D>
static void bwd_launch(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k, const void *v,
                       const float *lse, const float *delta, Geo g, cudaStream_t st) {
  dim3 gq((unsigned)((g.T + BR - 1) / BR), (unsigned)g.H, (unsigned)g.B);
  cudaFuncSetAttribute(fa_dq<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dq_smem<D>());
  fa_dq<D><<<gq, THREADS, dq_smem<D>(), st>>>((bf16 *)dq, (const bf16 *)dout, (const bf16 *)q, (const bf16 *)k,
                                              (const bf16 *)v, lse, delta, g);
  dim3 gk((unsigned)((g.T + BC - 1) / BC), (unsigned)g.Hkv, (unsigned)g.B);
  cudaFuncSetAttribute(fa_dkv<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dkv_smem<D>());
  fa_dkv<D><<<gk, THREADS, dkv_smem<D>(), st>>>((bf16 *)dk, (bf16 *)dv, (const bf16 *)dout, (const bf16 *)q,
                                                (const bf16 *)k, (const bf16 *)v, lse, delta, g);
}

extern "C" int fsdp_attention_tc_backward(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                                          const void *v, const void *out, const float *lse, int64_t B, int64_t T,
                                          int64_t H, int64_t Hkv, int64_t D, void *stream) {
  Geo g = {B, T, H, Hkv, 1.0f / sqrtf((float)D)};
  cudaStream_t st = (cudaStream_t)stream;
  float *delta = NULL; // stream-ordered scratch: B H T floats
  cudaError_t e = cudaMallocAsync((void **)&delta, sizeof(float) * (size_t)(B * H * T) + 4, st);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return fsdp_fail(FSDP_ENOMEM, "cuda attention backward: %lld bytes of scratch: %s", (long long)(4 * B * H * T),
                     cudaGetErrorString(e));
  }
  int64_t rows = B * T * H;
  fa_delta<<<(unsigned)((rows + 7) / 8), 256, 0, st>>>(delta, (const bf16 *)out, (const bf16 *)dout, g, (int)D);
  if (D == 64) bwd_launch<64>(dq, dk, dv, dout, q, k, v, lse, delta, g, st);
  else bwd_launch<128>(dq, dk, dv, dout, q, k, v, lse, delta, g, st);
  int rc = launched("cuda attention backward (tensor cores)");
  cudaFreeAsync(delta, st);
  return rc;
}
