// token_logprobs.cu: the CUDA twin of src/ops/token_logprobs.c: per-token
// log-probabilities and entropies of the targets, and the gradient of a
// loss written over them (post-training; fsdp.engine), one block per row,
// the gradient written over the logits in their dtype where asked (bf16
// logits never exist in fp32 in memory). The kernel's source is
// token_logprobs.cuh (also run on the CPU by
// tests/emu/test_token_logprobs_emu.cpp); targets outside [0, vocab) are
// taken as ignored there, so the caller checks them on the host.
#include "common.cuh"

using namespace fsdpk;

#define FSDP_TL_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
#include "token_logprobs.cuh"

extern "C" int fsdp_cuda_token_logprobs(float *logp, float *entropy, void *dlogits, const void *logits,
                                        const int32_t *targets, const float *coef, int64_t n, int64_t vocab,
                                        int32_t ignore_index, fsdp_dtype dtype, fsdp_stream *s) {
  if (n < 0 || vocab < 1 || n > 2147483647)
    return fsdp_fail(FSDP_EINVAL, "cuda token_logprobs: n = %lld, vocab = %lld", (long long)n, (long long)vocab);
  FSDP_CHECK(check_dtype(dtype, "cuda token_logprobs"));
  if (n > 0) FSDP_NEED_PTRS("cuda token_logprobs", logits, targets); /* logp, entropy, dlogits: each optional */
  if (n > 0 && dlogits && !coef)
    return fsdp_fail(FSDP_EINVAL, "cuda token_logprobs: dlogits without coef (dL/dlogp per row)");
  if (n == 0 || (!logp && !entropy && !dlogits)) return FSDP_OK;
  FSDP_DISPATCH(dtype, T, fsdp_tl::token_logprobs_kernel<T><<<(unsigned)n, 1024, 96 * sizeof(float), stream_of(s)>>>(
                              logp, entropy, (T *)dlogits, (const T *)logits, targets, coef, vocab, ignore_index));
  return launched("cuda token_logprobs");
}
