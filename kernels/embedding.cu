// embedding.cu: the CUDA twin of embedding.c, the whole table's and a
// vocab-parallel slice's (rows [first, first + rows) of it: the ids
// another rank holds give zero rows and no gradient). Ids are checked on
// the host before they reach the GPU (the Lua layer does it); a bad id
// here writes zeros instead of reading outside the table. The kernels'
// source is embedding.cuh and grad_sums.cuh (also run on the CPU by
// tests/emu/test_embedding_slice_emu.cpp and test_grad_sums_emu.cpp).
// The backward sorts the rows by id (CUB's radix sort) and sums each id's
// rows in fp32 in one block, adding to the table once: atomics into a bf16
// table would round after every occurrence, and a frequent token's
// gradient (hundreds of rows of a batch) would lose most of its small
// terms. Deterministic, too.
#include <cub/device/device_radix_sort.cuh>

#include "common.cuh"

using namespace fsdpk;
#include "embedding.cuh"
#include "grad_sums.cuh"

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

/* a slice: rows [first, first + rows) of the vocabulary */
static int slice_ok(int64_t n, int64_t vocab, int64_t first, int64_t rows, int64_t dim, int32_t dtype, const char *what) {
  if (rows < 1 || first < 0 || first + rows > vocab)
    return fsdp_fail(FSDP_EINVAL, "%s: rows [%lld, %lld) of a vocabulary of %lld", what, (long long)first,
                     (long long)(first + rows), (long long)vocab);
  return args_ok(n, vocab, dim, dtype, what);
}

/* rows [first, first + rows) of the table: the whole (0, vocab) or a slice */
static int forward_rows(void *y, const int32_t *ids, const void *table, int64_t n, int64_t first, int64_t rows,
                        int64_t dim, fsdp_dtype dtype, fsdp_stream *s) {
  if (n == 0) return FSDP_OK;
  FSDP_NEED_PTRS("cuda embedding", y, ids, table);
  FSDP_DISPATCH(dtype, T, fsdp_emb::embedding_fwd<T><<<(unsigned)n, 256, 0, stream_of(s)>>>((T *)y, ids, (const T *)table,
                                                                                              first, rows, dim));
  return launched("cuda embedding forward");
}

extern "C" int fsdp_cuda_embedding_forward(void *y, const int32_t *ids, const void *table, int64_t n, int64_t vocab,
                                           int64_t dim, fsdp_dtype dtype, fsdp_stream *s) {
  FSDP_CHECK(args_ok(n, vocab, dim, dtype, "cuda embedding"));
  return forward_rows(y, ids, table, n, 0, vocab, dim, dtype, s);
}

extern "C" int fsdp_cuda_embedding_forward_slice(void *y, const int32_t *ids, const void *table, int64_t n, int64_t vocab,
                                                 int64_t first, int64_t rows, int64_t dim, fsdp_dtype dtype,
                                                 fsdp_stream *s) {
  FSDP_CHECK(slice_ok(n, vocab, first, rows, dim, dtype, "cuda embedding (slice)"));
  return forward_rows(y, ids, table, n, first, rows, dim, dtype, s);
}

/* the table's rows [first, first + slice_rows): the sorted ids become
 * the slice's rows (ids_to_rows) where first > 0 */
static int backward_rows(void *dtable, const void *dy, const int32_t *ids, int64_t n, int64_t first, int64_t slice_rows,
                         int64_t dim, fsdp_dtype dtype, fsdp_stream *s) {
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
  float *part_first = (float *)(scratch + 3 * ints), *part_last = (float *)(scratch + 3 * ints + parts);
  row_numbers<<<blocks_for(n, 256), 256, 0, st_>>>(rows, n);
  cudaError_t e = cub::DeviceRadixSort::SortPairs(scratch + 3 * ints + 2 * parts, temp, ids, sorted, rows, rows_sorted, n, 0,
                                                  32, st_);
  if (e == cudaSuccess) {
    if (first) fsdp_emb::ids_to_rows<<<blocks_for(n, 256), 256, 0, st_>>>(sorted, n, first);
    dim3 grid((unsigned)windows, (unsigned)((dim + 255) / 256));
    FSDP_DISPATCH(dtype, T, fsdp_sums::embedding_bwd_windows<T><<<grid, 256, 0, st_>>>((T *)dtable, part_first, part_last,
                                                                                       (const T *)dy, sorted, rows_sorted,
                                                                                       n, slice_rows, dim));
    FSDP_DISPATCH(dtype, T, fsdp_sums::embedding_bwd_spans<T><<<grid, 256, 0, st_>>>((T *)dtable, part_first, part_last,
                                                                                     sorted, n, slice_rows, dim));
  }
  int rc = launched("cuda embedding backward");
  cudaFreeAsync(scratch, st_);
  if (e != cudaSuccess) return fsdp_fail(FSDP_EDEVICE, "cuda embedding backward: sorting the ids: %s", cudaGetErrorString(e));
  return rc;
}

extern "C" int fsdp_cuda_embedding_backward(void *dtable, const void *dy, const int32_t *ids, int64_t n, int64_t vocab,
                                            int64_t dim, fsdp_dtype dtype, fsdp_stream *s) {
  FSDP_CHECK(args_ok(n, vocab, dim, dtype, "cuda embedding backward"));
  return backward_rows(dtable, dy, ids, n, 0, vocab, dim, dtype, s);
}

extern "C" int fsdp_cuda_embedding_backward_slice(void *dtable, const void *dy, const int32_t *ids, int64_t n,
                                                  int64_t vocab, int64_t first, int64_t rows, int64_t dim,
                                                  fsdp_dtype dtype, fsdp_stream *s) {
  FSDP_CHECK(slice_ok(n, vocab, first, rows, dim, dtype, "cuda embedding backward (slice)"));
  return backward_rows(dtable, dy, ids, n, first, rows, dim, dtype, s);
}
