/* attention_merge.c: ring attention's combine (context parallelism, issue
 * 46). Each ring step attends the local queries to one block of keys,
 * giving a partial out_b and its lse_b; merging it into the accumulator
 * (out, lse) by their log-sum-exps leaves attention over all the keys seen
 * so far. The row's math is src/base/attention_merge_math.h, the CUDA
 * kernel's too. Shared among the rank's threads by (batch, head), each
 * row computed alone: the same bits for any thread count. */
#include "../base/attention_merge_math.h"
#include "../base/error.h"
#include "../base/parallel.h"
#include "../fsdp_ops.h"

typedef struct merge_job {
  float *out, *lse;
  const float *out_b, *lse_b;
  int64_t T, H, D;
} merge_job;

/* items bh = b * H + h: lse's rows [bh * T, bh * T + T); query t's out row
 * is (b * T + t) * H + h */
static void merge_heads(void *arg, int64_t lo, int64_t hi) {
  const merge_job *j = arg;
  const int64_t T = j->T, H = j->H, D = j->D;
  for (int64_t bh = lo; bh < hi; bh++) {
    const int64_t b = bh / H, h = bh % H;
    for (int64_t t = 0; t < T; t++) {
      const int64_t li = bh * T + t, oi = ((b * T + t) * H + h) * D;
      float wa = 0, wb = 0, merged = 0;
      const int how = fsdp_attention_merge_row(j->lse[li], j->lse_b[li], &wa, &wb, &merged);
      if (how == FSDP_MERGE_KEEP) continue;
      float *o = j->out + oi;
      const float *ob = j->out_b + oi;
      if (how == FSDP_MERGE_COPY)
        for (int64_t d = 0; d < D; d++) o[d] = ob[d];
      else
        for (int64_t d = 0; d < D; d++) o[d] = wa * o[d] + wb * ob[d];
      j->lse[li] = merged;
    }
  }
}

int fsdp_attention_merge(float *out, float *lse, const float *out_b, const float *lse_b, int64_t batch, int64_t seq,
                         int64_t heads, int64_t head_dim) {
  if (batch < 0 || seq < 0 || heads < 1 || head_dim < 1 || heads > INT32_MAX || head_dim > INT32_MAX)
    return fsdp_fail(FSDP_EINVAL, "attention_merge: batch=%lld seq=%lld heads=%lld head_dim=%lld", (long long)batch,
                     (long long)seq, (long long)heads, (long long)head_dim);
  if (!batch || !seq) return FSDP_OK;
  if (!out || !lse || !out_b || !lse_b)
    return fsdp_fail(FSDP_EINVAL, "attention_merge: NULL buffer (out %p, lse %p, out_b %p, lse_b %p)", (void *)out,
                     (void *)lse, (const void *)out_b, (const void *)lse_b);
  merge_job j = {.out = out, .lse = lse, .out_b = out_b, .lse_b = lse_b, .T = seq, .H = heads, .D = head_dim};
  /* a (batch, head) item is seq rows of head_dim: items enough for a
   * thread's share to be worth its start */
  fsdp_parallel_for(batch * heads, 1 + (1 << 15) / (seq * head_dim), merge_heads, &j);
  return FSDP_OK;
}
