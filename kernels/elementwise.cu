// elementwise.cu: the CUDA twins of residual.c (add, scale_add) and
// swiglu.c, and the casts the units use between fp32 shards and compute
// buffers. Memory bound: one grid-stride pass, fp32 arithmetic; add,
// scale-add and SwiGLU 16 bytes at a time (their source is elementwise.cuh, also run on
// the CPU by tests/emu/test_elementwise_emu.cpp).
#include "common.cuh"

using namespace fsdpk;

#include "elementwise.cuh"

using namespace fsdp_ew;

// threads for n elements, each moving 16 bytes where vec
template <typename T>
static unsigned blocks_vec(int64_t n, int vec) {
  return blocks_for(vec ? (n + Vec<T>::n - 1) / Vec<T>::n : n, 256);
}

static int args_ok(int64_t n, int32_t dtype, const char *what) {
  if (n < 0) return fsdp_fail(FSDP_EINVAL, "%s: negative length %lld", what, (long long)n);
  return check_dtype(dtype, what);
}

extern "C" int fsdp_cuda_add(void *y, const void *a, const void *b, int64_t n, fsdp_dtype dtype, fsdp_stream *s) {
  FSDP_CHECK(args_ok(n, dtype, "cuda add"));
  if (n == 0) return FSDP_OK;
  FSDP_NEED_PTRS("cuda add", y, a, b);
  const int v = aligned16({y, a, b});
  FSDP_DISPATCH(dtype, T, binary_kernel<T><<<blocks_vec<T>(n, v), 256, 0, stream_of(s)>>>(
                              (T *)y, (const T *)a, (const T *)b, n, v, AddOp()));
  return launched("cuda add");
}

extern "C" int fsdp_cuda_scale_add(void *y, float alpha, const void *x, int64_t n, fsdp_dtype dtype, fsdp_stream *s) {
  FSDP_CHECK(args_ok(n, dtype, "cuda scale_add"));
  if (n == 0) return FSDP_OK;
  FSDP_NEED_PTRS("cuda scale_add", y, x);
  const int v = aligned16({y, x});
  FSDP_DISPATCH(dtype, T, binary_kernel<T><<<blocks_vec<T>(n, v), 256, 0, stream_of(s)>>>(
                              (T *)y, (const T *)y, (const T *)x, n, v, ScaleAddOp{alpha}));
  return launched("cuda scale_add");
}

extern "C" int fsdp_cuda_swiglu_forward(void *y, const void *gate, const void *up, int64_t n, fsdp_dtype dtype,
                                        fsdp_stream *s) {
  FSDP_CHECK(args_ok(n, dtype, "cuda swiglu"));
  if (n == 0) return FSDP_OK;
  FSDP_NEED_PTRS("cuda swiglu", y, gate, up);
  const int v = aligned16({y, gate, up});
  FSDP_DISPATCH(dtype, T, binary_kernel<T><<<blocks_vec<T>(n, v), 256, 0, stream_of(s)>>>(
                              (T *)y, (const T *)gate, (const T *)up, n, v, SwiGLUOp()));
  return launched("cuda swiglu forward");
}

extern "C" int fsdp_cuda_swiglu_backward(void *dgate, void *dup, const void *dy, const void *gate, const void *up, int64_t n,
                                         fsdp_dtype dtype, fsdp_stream *s) {
  FSDP_CHECK(args_ok(n, dtype, "cuda swiglu backward"));
  if (n == 0) return FSDP_OK;
  FSDP_NEED_PTRS("cuda swiglu backward", dgate, dup, dy, gate, up);
  const int v = aligned16({dgate, dup, dy, gate, up});
  FSDP_DISPATCH(dtype, T, swiglu_bwd_kernel<T><<<blocks_vec<T>(n, v), 256, 0, stream_of(s)>>>(
                              (T *)dgate, (T *)dup, (const T *)dy, (const T *)gate, (const T *)up, n, v));
  return launched("cuda swiglu backward");
}

// ---- casts for the units (kernels.h) ----

template <typename T>
__global__ void accumulate_f32(float *dst, const T *src, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] += ld(src, i);
}

// the units' params: the compute copy from the fp32 main params
template <typename T>
__global__ void cast_from_f32(T *dst, const float *src, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    st_param(dst, i, src[i]);
}

extern "C" int fsdp_kernel_accumulate_f32(float *dst, const void *src, int src_dtype, size_t n, void *stream) {
  if (n == 0) return 0;
  cudaStream_t st_ = static_cast<cudaStream_t>(stream);
  if (src_dtype == FSDP_FP32)
    accumulate_f32<float><<<blocks_for((int64_t)n, 256), 256, 0, st_>>>(dst, (const float *)src, (int64_t)n);
  else if (src_dtype == FSDP_BF16)
    accumulate_f32<__nv_bfloat16><<<blocks_for((int64_t)n, 256), 256, 0, st_>>>(dst, (const __nv_bfloat16 *)src, (int64_t)n);
  else
    return static_cast<int>(cudaErrorInvalidValue);
  return static_cast<int>(cudaGetLastError());
}

extern "C" int fsdp_kernel_cast_from_f32(void *dst, int dst_dtype, const float *src, size_t n, void *stream) {
  if (n == 0) return 0;
  cudaStream_t st_ = static_cast<cudaStream_t>(stream);
  if (dst_dtype == FSDP_FP32)
    return static_cast<int>(cudaMemcpyAsync(dst, src, n * 4, cudaMemcpyDeviceToDevice, st_));
  if (dst_dtype != FSDP_BF16) return static_cast<int>(cudaErrorInvalidValue);
  cast_from_f32<__nv_bfloat16><<<blocks_for((int64_t)n, 256), 256, 0, st_>>>((__nv_bfloat16 *)dst, src, (int64_t)n);
  return static_cast<int>(cudaGetLastError());
}
