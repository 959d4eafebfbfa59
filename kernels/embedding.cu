// embedding.cu: the CUDA twin of embedding.c. Ids are checked on the host
// before they reach the GPU (the Lua layer does it); a bad id here writes
// zeros instead of reading outside the table.
// The backward sorts the rows by id (CUB's radix sort) and sums each id's
// rows in fp32 in one block, adding to the table once: atomics into a bf16
// table would round after every occurrence, and a frequent token's
// gradient (hundreds of rows of a batch) would lose most of its small
// terms. Deterministic, too.
#include <cub/device/device_radix_sort.cuh>

#include "common.cuh"

using namespace fsdpk;
#include "grad_sums.cuh"

template <typename T>
__global__ void embedding_fwd(T *y, const int32_t *ids, const T *table, int64_t n, int64_t vocab, int64_t dim) {
  int64_t row = blockIdx.x;
  int32_t id = ids[row];
  bool ok = id >= 0 && id < vocab;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) st(y, row * dim + j, ok ? ld(table, (int64_t)id * dim + j) : 0.0f);
}

__global__ void row_numbers(int32_t *rows, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    rows[i] = (int32_t)i;
}

static int args_ok(int64_t n, int64_t vocab, int64_t dim, int32_t dtype, const char *what) {
  if (n < 0 || vocab < 1 || dim < 1 || n > 2147483647)
    return fsdp_fail(FSDP_EINVAL, "%s: n = %lld, vocab = %lld, dim = %lld", what, (long long)n, (long long)vocab,
                     (long long)dim);
  return check_dtype(dtype, what);
}

extern "C" int fsdp_cuda_embedding_forward(void *y, const int32_t *ids, const void *table, int64_t n, int64_t vocab,
                                           int64_t dim, fsdp_dtype dtype, fsdp_stream *s) {
  FSDP_CHECK(args_ok(n, vocab, dim, dtype, "cuda embedding"));
  if (n == 0) return FSDP_OK;
  FSDP_NEED_PTRS("cuda embedding", y, ids, table);
  FSDP_DISPATCH(dtype, T, embedding_fwd<T><<<(unsigned)n, 256, 0, stream_of(s)>>>((T *)y, ids, (const T *)table, n, vocab, dim));
  return launched("cuda embedding forward");
}

extern "C" int fsdp_cuda_embedding_backward(void *dtable, const void *dy, const int32_t *ids, int64_t n, int64_t vocab,
                                            int64_t dim, fsdp_dtype dtype, fsdp_stream *s) {
  FSDP_CHECK(args_ok(n, vocab, dim, dtype, "cuda embedding backward"));
  if (n == 0) return FSDP_OK;
  FSDP_NEED_PTRS("cuda embedding backward", dtable, dy, ids);
  cudaStream_t st_ = stream_of(s);
  // scratch, stream-ordered: sorted ids, row numbers before and after, the
  // windows' partial sums (grad_sums.cuh), CUB's temp
  int64_t windows = (n + fsdp_sums::EMB_WIN - 1) / fsdp_sums::EMB_WIN;
  size_t temp = 0, ints = ((size_t)n * sizeof(int32_t) + 255) / 256 * 256;
  size_t parts = ((size_t)windows * (size_t)dim * sizeof(float) + 255) / 256 * 256;
  if (cub::DeviceRadixSort::SortPairs(nullptr, temp, ids, (int32_t *)nullptr, (const int32_t *)nullptr, (int32_t *)nullptr,
                                      n, 0, 32, st_) != cudaSuccess)
    return launched("cuda embedding backward (sort size)");
  char *scratch = nullptr;
  if (cudaMallocAsync((void **)&scratch, 3 * ints + 2 * parts + temp, st_) != cudaSuccess)
    return fsdp_fail(FSDP_ENOMEM, "cuda embedding backward: %zu bytes of scratch for %lld rows",
                     3 * ints + 2 * parts + temp, (long long)n);
  int32_t *sorted = (int32_t *)scratch, *rows = (int32_t *)(scratch + ints), *rows_sorted = (int32_t *)(scratch + 2 * ints);
  float *first = (float *)(scratch + 3 * ints), *last = (float *)(scratch + 3 * ints + parts);
  row_numbers<<<blocks_for(n, 256), 256, 0, st_>>>(rows, n);
  cudaError_t e = cub::DeviceRadixSort::SortPairs(scratch + 3 * ints + 2 * parts, temp, ids, sorted, rows, rows_sorted, n, 0,
                                                  32, st_);
  if (e == cudaSuccess) {
    dim3 grid((unsigned)windows, (unsigned)((dim + 255) / 256));
    FSDP_DISPATCH(dtype, T, fsdp_sums::embedding_bwd_windows<T><<<grid, 256, 0, st_>>>((T *)dtable, first, last, (const T *)dy,
                                                                                       sorted, rows_sorted, n, vocab, dim));
    FSDP_DISPATCH(dtype, T, fsdp_sums::embedding_bwd_spans<T><<<grid, 256, 0, st_>>>((T *)dtable, first, last, sorted, n,
                                                                                     vocab, dim));
  }
  int rc = launched("cuda embedding backward");
  cudaFreeAsync(scratch, st_);
  if (e != cudaSuccess) return fsdp_fail(FSDP_EDEVICE, "cuda embedding backward: sorting the ids: %s", cudaGetErrorString(e));
  return rc;
}
