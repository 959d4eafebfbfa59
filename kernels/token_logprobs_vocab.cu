// token_logprobs_vocab.cu: the CUDA twin of src/ops/token_logprobs_vocab.c,
// per-token log-probabilities, entropies and coef (onehot - softmax) of
// logits split over the vocabulary (a tensor-parallel head), in the passes
// fsdp.tp runs around its collectives after the cross-entropy's stats and
// combine (cross_entropy_vocab.cu). The kernels' source is
// token_logprobs_vocab.cuh (also run on the CPU by
// tests/emu/test_token_logprobs_vocab_emu.cpp). Targets are checked on the
// host; one outside [0, vocab) is taken as ignored here.
#include "common.cuh"

using namespace fsdpk;

#define FSDP_CE_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
#include "token_logprobs_vocab.cuh"

static const unsigned ROW_THREADS = 1024; /* a block per row, as the cross-entropy's passes */
static const size_t ROW_SHARED = 32 * sizeof(float);

extern "C" int fsdp_cuda_token_logprobs_vocab_sums(float *sum, float *xsum, const void *logits, const float *row_max,
                                                   int64_t n, int64_t cols, fsdp_dtype dtype, fsdp_stream *s) {
  const char *what = "cuda token_logprobs_vocab_sums";
  if (n < 0 || n > 2147483647 || cols < 1)
    return fsdp_fail(FSDP_EINVAL, "%s: bad arguments (n=%lld cols=%lld)", what, (long long)n, (long long)cols);
  FSDP_CHECK(check_dtype(dtype, what));
  if (n == 0) return FSDP_OK;
  FSDP_NEED_PTRS(what, sum, logits, row_max); /* xsum: optional */
  FSDP_DISPATCH(dtype, T, fsdp_tlv::vocab_sums<T><<<(unsigned)n, ROW_THREADS, ROW_SHARED, stream_of(s)>>>(
                              sum, xsum, (const T *)logits, row_max, cols));
  return launched(what);
}

extern "C" int fsdp_cuda_token_logprobs_vocab_finish(float *logp, float *entropy, void *dlogits, const void *logits,
                                                     const int32_t *targets, const float *coef, const float *row_max,
                                                     const float *sum, const float *xsum, const float *target_logit,
                                                     int64_t n, int64_t vocab, int64_t first, int64_t cols,
                                                     int32_t ignore_index, fsdp_dtype dtype, fsdp_stream *s) {
  const char *what = "cuda token_logprobs_vocab_finish";
  if (n < 0 || n > 2147483647 || vocab < 1 || cols < 1 || first < 0 || first + cols > vocab)
    return fsdp_fail(FSDP_EINVAL, "%s: bad arguments (n=%lld vocab=%lld columns [%lld, %lld))", what, (long long)n,
                     (long long)vocab, (long long)first, (long long)(first + cols));
  FSDP_CHECK(check_dtype(dtype, what));
  if (n == 0) return FSDP_OK;
  FSDP_NEED_PTRS(what, targets, row_max, sum, target_logit); /* logp, entropy, dlogits: each optional */
  if (entropy && !xsum) return fsdp_fail(FSDP_EINVAL, "%s: entropy without xsum", what);
  if (dlogits && !coef) return fsdp_fail(FSDP_EINVAL, "%s: dlogits without coef (dL/dlogp per row)", what);
  if (dlogits) FSDP_NEED_PTRS(what, logits);
  if (!logp && !entropy && !dlogits) return FSDP_OK;
  FSDP_DISPATCH(dtype, T, fsdp_tlv::vocab_finish<T><<<(unsigned)n, ROW_THREADS, ROW_SHARED, stream_of(s)>>>(
                              logp, entropy, (T *)dlogits, (const T *)logits, targets, coef, row_max, sum, xsum,
                              target_logit, vocab, first, cols, ignore_index));
  return launched(what);
}
