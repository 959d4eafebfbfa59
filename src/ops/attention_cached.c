/* attention_cached.c: causal GQA attention of new queries against a KV
 * cache, for generation (fsdp generate): the queries of positions pos ..
 * pos + tq - 1 each see the cached keys 0 .. their own position. One query
 * row at a time, in fp32: memory-bound work on a cache that grows by a
 * token a step, where attention.c's GEMM tiling buys nothing.
 * Shared among the rank's threads by (batch, head, query) rows, each row
 * computed as it would be alone: the same bits for any thread count. */
#include <math.h>

#include "../base/error.h"
#include "../base/parallel.h"
#include "../fsdp_ops.h"

enum { CHUNK = 256 }; /* keys scored on the stack at a time */

typedef struct cached_job {
  float *out;
  const float *q, *k, *v;
  int64_t tq, pos, cap, heads, kv_heads, dim;
} cached_job;

/* Keys in chunks with a running max (the online softmax): the output row
 * is rescaled when a chunk raises the max, so no row-length buffer is
 * needed however long the cache. */
static void rows_range(void *arg, int64_t lo, int64_t hi) {
  const cached_job *j = arg;
  const int64_t H = j->heads, D = j->dim, Hkv = j->kv_heads, group = H / Hkv;
  const float scale = 1.0f / sqrtf((float)D);
  float s[CHUNK];
  for (int64_t r = lo; r < hi; r++) {
    /* r = (b * tq + i) * H + h: query i of head h in sequence b */
    int64_t h = r % H, bi = r / H, i = bi % j->tq, b = bi / j->tq;
    int64_t kh = h / group, seen = j->pos + i + 1;
    const float *q = j->q + r * D;
    const float *kb = j->k + (b * j->cap * Hkv + kh) * D, *vb = j->v + (b * j->cap * Hkv + kh) * D;
    float *o = j->out + r * D;
    float mx = -INFINITY, sum = 0.0f;
    for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
    for (int64_t t0 = 0; t0 < seen; t0 += CHUNK) {
      int64_t n = seen - t0 < CHUNK ? seen - t0 : CHUNK;
      float cmx = mx;
      for (int64_t t = 0; t < n; t++) {
        const float *k = kb + (t0 + t) * Hkv * D;
        float dot = 0.0f;
        for (int64_t d = 0; d < D; d++) dot += q[d] * k[d];
        s[t] = dot * scale;
        if (s[t] > cmx) cmx = s[t];
      }
      if (cmx > mx) { /* the sums so far were taken from a smaller max */
        float c = expf(mx - cmx);
        sum *= c;
        for (int64_t d = 0; d < D; d++) o[d] *= c;
        mx = cmx;
      }
      for (int64_t t = 0; t < n; t++) {
        const float *v = vb + (t0 + t) * Hkv * D;
        float p = expf(s[t] - mx);
        sum += p;
        for (int64_t d = 0; d < D; d++) o[d] += p * v[d];
      }
    }
    for (int64_t d = 0; d < D; d++) o[d] /= sum;
  }
}

int fsdp_attention_cached(float *out, const float *q, const float *k_cache, const float *v_cache, int64_t batch,
                          int64_t tq, int64_t pos, int64_t cap, int64_t heads, int64_t kv_heads, int64_t head_dim) {
  if (batch < 1 || tq < 1 || pos < 0 || heads < 1 || kv_heads < 1 || head_dim < 1 || heads % kv_heads ||
      pos + tq > cap || !out || !q || !k_cache || !v_cache)
    return fsdp_fail(FSDP_EINVAL,
                     "attention_cached: bad arguments (batch=%lld, queries=%lld at position %lld, cache of %lld, heads=%lld, "
                     "kv_heads=%lld, head_dim=%lld)",
                     (long long)batch, (long long)tq, (long long)pos, (long long)cap, (long long)heads, (long long)kv_heads,
                     (long long)head_dim);
  int64_t rows = batch * tq * heads;
  cached_job j = {.out = out, .q = q, .k = k_cache, .v = v_cache, .tq = tq, .pos = pos, .cap = cap,
                  .heads = heads, .kv_heads = kv_heads, .dim = head_dim};
  /* a row costs (pos + tq) * head_dim * 2 multiply-adds: rows enough for a
   * thread's share to be worth its start */
  int64_t grain = 1 + (1 << 16) / ((pos + tq) * head_dim);
  fsdp_parallel_for(rows, grain, rows_range, &j);
  return FSDP_OK;
}
