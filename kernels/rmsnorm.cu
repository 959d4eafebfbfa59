// rmsnorm.cu: the CUDA twin of rmsnorm.c. One block per row for y and dx
// (fp32 sums, 16-byte loads: rmsnorm.cuh, also run on the CPU by
// tests/emu/test_rmsnorm_emu.cpp); dw by column blocks over chunks of rows, each chunk's fp32
// partial sum into a scratch row, then summed per column in fp32 and added
// to dw once (bf16 atomics would round after every chunk; deterministic).
#include "common.cuh"

using namespace fsdpk;
#include "grad_sums.cuh"

using namespace fsdp_sums;

#define FSDP_RMS_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
#include "rmsnorm.cuh"

using namespace fsdp_rms;

// 1 when the rows' elements go 16 bytes at a time: every buffer 16-byte
// aligned and dim a whole number of vectors (then every row starts aligned)
template <typename T>
static int rows_vec(int64_t dim, std::initializer_list<const void *> ptrs) {
  return dim % Vec<T>::n == 0 && aligned16(ptrs);
}

extern "C" int fsdp_cuda_rmsnorm_forward(void *y, float *rstd, const void *x, const void *w, int64_t n, int64_t dim, float eps,
                                         fsdp_dtype dtype, fsdp_stream *s) {
  if (n < 0 || dim < 1 || n > 2147483647) return fsdp_fail(FSDP_EINVAL, "cuda rmsnorm: n = %lld, dim = %lld", (long long)n, (long long)dim);
  FSDP_CHECK(check_dtype(dtype, "cuda rmsnorm"));
  if (n == 0) return FSDP_OK;
  FSDP_NEED_PTRS("cuda rmsnorm", y, rstd, x, w);
  FSDP_DISPATCH(dtype, T, {
    const int v = rows_vec<T>(dim, {y, x, w});
    rmsnorm_fwd_kernel<T><<<(unsigned)n, row_threads(dim, v, Vec<T>::n), 32 * sizeof(float), stream_of(s)>>>(
        (T *)y, rstd, (const T *)x, (const T *)w, dim, eps, v);
  });
  return launched("cuda rmsnorm forward");
}

extern "C" int fsdp_cuda_rmsnorm_backward(void *dx, void *dw, const void *dy, const void *x, const void *w, const float *rstd,
                                          int64_t n, int64_t dim, fsdp_dtype dtype, fsdp_stream *s) {
  if (n < 0 || dim < 1 || n > 2147483647 || !rstd)
    return fsdp_fail(FSDP_EINVAL, "cuda rmsnorm backward: n = %lld, dim = %lld, rstd %s", (long long)n, (long long)dim,
                     rstd ? "given" : "NULL");
  FSDP_CHECK(check_dtype(dtype, "cuda rmsnorm backward"));
  if (n == 0) return FSDP_OK;
  FSDP_NEED_PTRS("cuda rmsnorm backward", dx, dy, x, w); /* dw: optional */
  cudaStream_t st_ = stream_of(s);
  FSDP_DISPATCH(dtype, T, {
    const int v = rows_vec<T>(dim, {dx, dy, x, w});
    rmsnorm_bwd_dx_kernel<T><<<(unsigned)n, row_threads(dim, v, Vec<T>::n), 32 * sizeof(float), st_>>>(
        (T *)dx, (const T *)dy, (const T *)x, (const T *)w, rstd, dim, v);
  });
  if (dw) {
    int64_t chunks = (n + DW_ROWS - 1) / DW_ROWS;
    float *part = nullptr;
    if (cudaMallocAsync((void **)&part, sizeof(float) * (size_t)(chunks * dim), st_) != cudaSuccess)
      return fsdp_fail(FSDP_ENOMEM, "cuda rmsnorm backward: %lld x %lld fp32 partial sums", (long long)chunks, (long long)dim);
    dim3 grid((unsigned)((dim + 255) / 256), (unsigned)chunks);
    FSDP_DISPATCH(dtype, T, rmsnorm_dw_parts<T><<<grid, 256, 0, st_>>>(part, (const T *)dy, (const T *)x, rstd, n, dim));
    FSDP_DISPATCH(dtype, T, rmsnorm_dw_sum<T><<<(unsigned)((dim + 255) / 256), 256, 0, st_>>>((T *)dw, part, chunks, dim));
    cudaFreeAsync(part, st_);
  }
  return launched("cuda rmsnorm backward");
}
