// attention_cached.cu: the CUDA twin of attention_cached.c, generation's
// attention of new queries against a KV cache (attention_cached.cuh, also
// run on the CPU by tests/emu/test_attention_cached_emu.cpp).
#include "common.cuh"

using namespace fsdpk;

#define FSDP_CACHED_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
#include "attention_cached.cuh"

using namespace fsdp_cached;

extern "C" int fsdp_cuda_attention_cached(void *out, const void *q, const void *k_cache, const void *v_cache, int64_t batch,
                                          int64_t tq, int64_t pos, int64_t cap, int64_t heads, int64_t kv_heads,
                                          int64_t head_dim, fsdp_dtype dtype, fsdp_stream *s) {
  const unsigned threads = 128;
  if (batch < 1 || tq < 1 || pos < 0 || heads < 1 || kv_heads < 1 || head_dim < 1 || heads % kv_heads || pos + tq > cap ||
      head_dim > CACHED_DIMS * (int64_t)threads || batch * tq * heads > 2147483647)
    return fsdp_fail(FSDP_EINVAL,
                     "cuda attention_cached: bad arguments (batch=%lld, queries=%lld at position %lld, cache of %lld, "
                     "heads=%lld, kv_heads=%lld, head_dim=%lld, at most %d)",
                     (long long)batch, (long long)tq, (long long)pos, (long long)cap, (long long)heads, (long long)kv_heads,
                     (long long)head_dim, CACHED_DIMS * (int)threads);
  FSDP_CHECK(check_dtype(dtype, "cuda attention_cached"));
  FSDP_NEED_PTRS("cuda attention_cached", out, q, k_cache, v_cache);
  const size_t smem = (size_t)(head_dim + CACHED_CHUNK + 32) * sizeof(float);
  const float scale = 1.0f / sqrtf((float)head_dim);
  FSDP_DISPATCH(dtype, T, attention_cached_kernel<T><<<(unsigned)(batch * tq * heads), threads, smem, stream_of(s)>>>(
                              (T *)out, (const T *)q, (const T *)k_cache, (const T *)v_cache, tq, pos, cap, heads, kv_heads,
                              head_dim, scale));
  return launched("cuda attention_cached");
}
