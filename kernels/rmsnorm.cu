// rmsnorm.cu: the CUDA twin of rmsnorm.c. One block per row for y and dx
// (fp32 sums); dw by column blocks over chunks of rows, each chunk's fp32
// partial sum into a scratch row, then summed per column in fp32 and added
// to dw once (bf16 atomics would round after every chunk; deterministic).
#include "common.cuh"

using namespace fsdpk;
#include "grad_sums.cuh"

using namespace fsdp_sums;

template <typename T>
__global__ void rmsnorm_fwd(T *y, float *rstd, const T *x, const T *w, int64_t dim, float eps) {
  int64_t row = blockIdx.x;
  const T *xr = x + row * dim;
  float ss = 0;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    float v = ld(xr, j);
    ss += v * v;
  }
  ss = block_reduce(ss, Sum());
  float r = rsqrtf(ss / (float)dim + eps);
  if (threadIdx.x == 0 && rstd) rstd[row] = r;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) st(y, row * dim + j, ld(w, j) * (ld(xr, j) * r));
}

// dx = r (w dy) - r^3 x mean(w dy x)
template <typename T>
__global__ void rmsnorm_bwd_dx(T *dx, const T *dy, const T *x, const T *w, const float *rstd, int64_t dim) {
  int64_t row = blockIdx.x;
  const T *xr = x + row * dim, *dyr = dy + row * dim;
  float r = rstd[row], dot = 0;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) dot += ld(w, j) * ld(dyr, j) * ld(xr, j);
  dot = block_reduce(dot, Sum()) / (float)dim;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
    st(dx, row * dim + j, r * ld(w, j) * ld(dyr, j) - r * r * r * ld(xr, j) * dot);
}

static unsigned row_threads(int64_t dim) { return dim >= 1024 ? 1024u : dim >= 256 ? 256u : 64u; }

extern "C" int fsdp_cuda_rmsnorm_forward(void *y, float *rstd, const void *x, const void *w, int64_t n, int64_t dim, float eps,
                                         fsdp_dtype dtype, fsdp_stream *s) {
  if (n < 0 || dim < 1 || n > 2147483647) return fsdp_fail(FSDP_EINVAL, "cuda rmsnorm: n = %lld, dim = %lld", (long long)n, (long long)dim);
  FSDP_CHECK(check_dtype(dtype, "cuda rmsnorm"));
  if (n == 0) return FSDP_OK;
  FSDP_NEED_PTRS("cuda rmsnorm", y, rstd, x, w);
  FSDP_DISPATCH(dtype, T, rmsnorm_fwd<T><<<(unsigned)n, row_threads(dim), 0, stream_of(s)>>>(
                              (T *)y, rstd, (const T *)x, (const T *)w, dim, eps));
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
  FSDP_DISPATCH(dtype, T, rmsnorm_bwd_dx<T><<<(unsigned)n, row_threads(dim), 0, st_>>>(
                              (T *)dx, (const T *)dy, (const T *)x, (const T *)w, rstd, dim));
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
