// cross_entropy_vocab.cu: the CUDA twin of src/ops/cross_entropy_vocab.c,
// the cross-entropy of logits split over the vocabulary (a tensor-parallel
// head), in the passes fsdp.tp runs around its collectives, plus the
// combine of the gathered stats on the device (the CPU path does it in
// Lua). The kernels' source is cross_entropy_vocab.cuh (also run on the
// CPU by tests/emu/test_cross_entropy_vocab_emu.cpp). Targets are checked
// on the host (fsdp.models.llama counts them); one outside [0, vocab) that
// is not the ignore index is taken as another rank's here.
#include "common.cuh"

using namespace fsdpk;

#define FSDP_CE_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
#include "cross_entropy_vocab.cuh"

static const unsigned ROW_THREADS = 1024; /* a block per row, as the fused cross-entropy */
static const size_t ROW_SHARED = 32 * sizeof(float);

static int rows_ok(const char *what, int64_t n, int64_t vocab, int64_t first, int64_t cols, fsdp_dtype dtype) {
  if (n < 0 || n > 2147483647 || vocab < 1 || cols < 1 || first < 0 || first + cols > vocab)
    return fsdp_fail(FSDP_EINVAL, "%s: bad arguments (n=%lld vocab=%lld columns [%lld, %lld))", what, (long long)n,
                     (long long)vocab, (long long)first, (long long)(first + cols));
  return check_dtype(dtype, what);
}

extern "C" int fsdp_cuda_cross_entropy_vocab_stats(float *row_max, float *target_logit, const void *logits,
                                                   const int32_t *targets, int64_t n, int64_t vocab, int64_t first,
                                                   int64_t cols, int32_t ignore_index, fsdp_dtype dtype, fsdp_stream *s) {
  const char *what = "cuda cross_entropy_vocab_stats";
  FSDP_CHECK(rows_ok(what, n, vocab, first, cols, dtype));
  if (n == 0) return FSDP_OK;
  FSDP_NEED_PTRS(what, row_max, target_logit, logits, targets);
  FSDP_DISPATCH(dtype, T, fsdp_vce::vocab_stats<T><<<(unsigned)n, ROW_THREADS, ROW_SHARED, stream_of(s)>>>(
                              row_max, target_logit, (const T *)logits, targets, first, cols, ignore_index));
  return launched(what);
}

extern "C" int fsdp_cuda_cross_entropy_vocab_combine(float *row_max, float *target_logit, const float *gathered,
                                                     int64_t n, int ranks, fsdp_stream *s) {
  const char *what = "cuda cross_entropy_vocab_combine";
  if (n < 0 || ranks < 1)
    return fsdp_fail(FSDP_EINVAL, "%s: bad arguments (n=%lld ranks=%d)", what, (long long)n, ranks);
  if (n == 0) return FSDP_OK;
  FSDP_NEED_PTRS(what, row_max, target_logit, gathered);
  fsdp_vce::vocab_combine<><<<blocks_for(n, 256), 256, 0, stream_of(s)>>>(row_max, target_logit, gathered, n, ranks);
  return launched(what);
}

extern "C" int fsdp_cuda_cross_entropy_vocab_sum(float *sum, const void *logits, const float *row_max, int64_t n,
                                                 int64_t cols, fsdp_dtype dtype, fsdp_stream *s) {
  const char *what = "cuda cross_entropy_vocab_sum";
  FSDP_CHECK(rows_ok(what, n, cols, 0, cols, dtype));
  if (n == 0) return FSDP_OK;
  FSDP_NEED_PTRS(what, sum, logits, row_max);
  FSDP_DISPATCH(dtype, T, fsdp_vce::vocab_sum<T><<<(unsigned)n, ROW_THREADS, ROW_SHARED, stream_of(s)>>>(
                              sum, (const T *)logits, row_max, cols));
  return launched(what);
}

extern "C" int fsdp_cuda_cross_entropy_vocab_finish(double *loss_sum, int64_t *count, void *dlogits, const void *logits,
                                                    const int32_t *targets, const float *row_max, const float *sum,
                                                    const float *target_logit, int64_t n, int64_t vocab, int64_t first,
                                                    int64_t cols, int32_t ignore_index, float grad_scale,
                                                    fsdp_dtype dtype, fsdp_stream *s) {
  const char *what = "cuda cross_entropy_vocab_finish";
  FSDP_CHECK(rows_ok(what, n, vocab, first, cols, dtype));
  FSDP_NEED_PTRS(what, loss_sum, count);
  if (n > 0) FSDP_NEED_PTRS(what, logits, targets, row_max, sum, target_logit); /* dlogits: optional */
  cudaStream_t st_ = stream_of(s);
  if (cudaMemsetAsync(loss_sum, 0, sizeof(double), st_) != cudaSuccess || cudaMemsetAsync(count, 0, sizeof(int64_t), st_) != cudaSuccess)
    return launched(what);
  if (n == 0) return FSDP_OK;
  FSDP_DISPATCH(dtype, T, fsdp_vce::vocab_finish<T><<<(unsigned)n, ROW_THREADS, ROW_SHARED, st_>>>(
                              loss_sum, (unsigned long long *)count, (T *)dlogits, (const T *)logits, targets, row_max,
                              sum, target_logit, first, cols, ignore_index, grad_scale));
  return launched(what);
}
