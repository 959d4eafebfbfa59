// attention_merge.cu: the CUDA twin of attention_merge.c, ring attention's
// combine of a partial result into the accumulator by their log-sum-exps
// (attention_merge.cuh, also run on the CPU by
// tests/emu/test_attention_merge_emu.cpp).
#include "common.cuh"

using namespace fsdpk;

#include "attention_merge.cuh"

extern "C" int fsdp_cuda_attention_merge(void *out, float *lse, const void *out_b, const float *lse_b, int64_t batch,
                                         int64_t seq, int64_t heads, int64_t head_dim, fsdp_dtype dtype, fsdp_stream *s) {
  const char *what = "cuda attention_merge";
  if (batch < 0 || seq < 0 || heads < 1 || head_dim < 1 || heads > 2147483647 || head_dim > 2147483647)
    return fsdp_fail(FSDP_EINVAL, "%s: batch=%lld seq=%lld heads=%lld head_dim=%lld", what, (long long)batch,
                     (long long)seq, (long long)heads, (long long)head_dim);
  FSDP_CHECK(check_dtype(dtype, what));
  const int64_t rows = batch * seq * heads;
  if (rows == 0) return FSDP_OK;
  FSDP_NEED_PTRS(what, out, lse, out_b, lse_b);
  const unsigned threads = 256; /* 8 rows a block */
  FSDP_DISPATCH(dtype, T, fsdp_merge::merge_rows<T><<<blocks_for(rows, threads / 32), threads, 0, stream_of(s)>>>(
                              (T *)out, lse, (const T *)out_b, lse_b, rows, seq, heads, head_dim));
  return launched(what);
}
