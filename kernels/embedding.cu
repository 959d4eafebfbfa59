// embedding.cu: the CUDA twin of embedding.c. Ids are checked on the host
// before they reach the GPU (the Lua layer does it); a bad id here writes
// zeros instead of reading outside the table.
#include "common.cuh"

using namespace fsdpk;

template <typename T>
__global__ void embedding_fwd(T *y, const int32_t *ids, const T *table, int64_t n, int64_t vocab, int64_t dim) {
  int64_t row = blockIdx.x;
  int32_t id = ids[row];
  bool ok = id >= 0 && id < vocab;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) st(y, row * dim + j, ok ? ld(table, (int64_t)id * dim + j) : 0.0f);
}

template <typename T>
__global__ void embedding_bwd(T *dtable, const T *dy, const int32_t *ids, int64_t n, int64_t vocab, int64_t dim) {
  int64_t row = blockIdx.x;
  int32_t id = ids[row];
  if (id < 0 || id >= vocab) return;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) atomic_add(dtable + (int64_t)id * dim + j, ld(dy, row * dim + j));
}

static int args_ok(int64_t n, int64_t vocab, int64_t dim, int32_t dtype, const char *what) {
  if (n < 0 || vocab < 1 || dim < 1 || n > 2147483647)
    return fsdp_fail(FSDP_EINVAL, "%s: n = %lld, vocab = %lld, dim = %lld", what, (long long)n, (long long)vocab,
                     (long long)dim);
  return check_dtype(dtype, what);
}

extern "C" int fsdp_cuda_embedding_forward(void *y, const int32_t *ids, const void *table, int64_t n, int64_t vocab,
                                           int64_t dim, int32_t dtype, fsdp_stream *s) {
  FSDP_CHECK(args_ok(n, vocab, dim, dtype, "cuda embedding"));
  if (n == 0) return FSDP_OK;
  FSDP_DISPATCH(dtype, T, embedding_fwd<T><<<(unsigned)n, 256, 0, stream_of(s)>>>((T *)y, ids, (const T *)table, n, vocab, dim));
  return launched("cuda embedding forward");
}

extern "C" int fsdp_cuda_embedding_backward(void *dtable, const void *dy, const int32_t *ids, int64_t n, int64_t vocab,
                                            int64_t dim, int32_t dtype, fsdp_stream *s) {
  FSDP_CHECK(args_ok(n, vocab, dim, dtype, "cuda embedding backward"));
  if (n == 0) return FSDP_OK;
  FSDP_DISPATCH(dtype, T, embedding_bwd<T><<<(unsigned)n, 256, 0, stream_of(s)>>>((T *)dtable, (const T *)dy, ids, n, vocab, dim));
  return launched("cuda embedding backward");
}
