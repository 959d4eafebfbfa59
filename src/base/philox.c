/* philox.c: the counter-based RNG Philox-4x32-10 (Salmon et al., SC'11),
 * and fills built on it. A value depends only on (seed, stream, index), so a
 * rank can draw exactly the elements it owns, and the CUDA twin (same
 * arithmetic) gives the same bits on the GPU.
 *
 * Mapping: key = {seed_lo, seed_hi ^ stream}, counter = {index_lo, index_hi,
 * 0, 0}; element `index` uses words 0 and 1 of that block:
 *   uniform(a, b):   a + (b - a) * u0,  u0 = (w0 >> 8 + 0.5) * 2^-24 in (0, 1)
 *   normal(mean, std): Box-Muller, mean + std * sqrt(-2 ln u0) cos(2 pi u1)
 * computed in float64 and rounded once to the destination dtype. */
#include <math.h>

#include "error.h"
#include "heartbeat.h"
#include "parallel.h"
#include "../fsdp_base.h"

void fsdp_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; round++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

uint32_t fsdp_rng_stream_id(const char *name) {
  uint32_t h = 2166136261u; /* FNV-1a */
  for (const unsigned char *p = (const unsigned char *)(name ? name : ""); *p; p++) h = (h ^ *p) * 16777619u;
  return h;
}

static double unit_open(uint32_t w) { return ((double)(w >> 8) + 0.5) * (1.0 / 16777216.0); }

/* one chunk of a fill: elements [lo, hi) of the call, drawn into a small
 * float64 batch and converted once per batch (a conversion per element was
 * a third of the time) */
typedef struct fill_job {
  void *dst;
  fsdp_dtype dtype;
  uint32_t key[2];
  int64_t first_index;
  int dist;
  double a, b;
} fill_job;

static void fill_range(void *arg, int64_t lo, int64_t hi) {
  const fill_job *j = arg;
  enum { BATCH = 256 };
  double v[BATCH];
  size_t es = fsdp_dtype_size(j->dtype);
  for (int64_t at = lo; at < hi; at += BATCH) {
    int m = hi - at < BATCH ? (int)(hi - at) : BATCH;
    /* every 64Ki values (a few ms): meta init of a large shard takes
     * minutes, and fsdprun --heartbeat-timeout must not take it for a stall */
    if (((at - lo) & 0xffff) == 0) fsdp_heartbeat_pulse();
    for (int i = 0; i < m; i++) {
      uint64_t idx = (uint64_t)(j->first_index + at + i);
      const uint32_t ctr[4] = {(uint32_t)idx, (uint32_t)(idx >> 32), 0, 0};
      uint32_t w[4];
      fsdp_philox4x32_10(ctr, j->key, w);
      double u0 = unit_open(w[0]);
      if (j->dist == FSDP_RNG_UNIFORM)
        v[i] = j->a + (j->b - j->a) * u0;
      else
        v[i] = j->a + j->b * sqrt(-2.0 * log(u0)) * cos(6.283185307179586 * unit_open(w[1]));
    }
    /* cannot fail: the dtype was checked before the threads started */
    (void)fsdp_convert((char *)j->dst + (size_t)at * es, j->dtype, v, FSDP_FP64, (size_t)m);
  }
}

int fsdp_rng_fill(void *dst, fsdp_dtype dtype, int64_t n, uint64_t seed, uint32_t stream, int64_t first_index, int dist,
                  double a, double b) {
  if (n < 0 || first_index < 0) return fsdp_fail(FSDP_EINVAL, "rng_fill: negative count or index");
  if (!fsdp_dtype_size(dtype)) return fsdp_fail(FSDP_EINVAL, "rng_fill: unknown dtype %d", dtype);
  if (dist != FSDP_RNG_UNIFORM && dist != FSDP_RNG_NORMAL)
    return fsdp_fail(FSDP_EINVAL, "rng_fill: unknown distribution %d (expected uniform or normal)", dist);
  if (n && !dst) return fsdp_fail(FSDP_EINVAL, "rng_fill: NULL destination");
  fill_job j = {.dst = dst, .dtype = dtype, .key = {(uint32_t)seed, (uint32_t)(seed >> 32) ^ stream},
                .first_index = first_index, .dist = dist, .a = a, .b = b};
  /* every value depends on its index alone, so the threads' split changes
   * no bit; meta init of a large model on one rank was minutes on one core
   * (4.4B values at ~20M/s) */
  fsdp_parallel_for(n, 1 << 16, fill_range, &j);
  return FSDP_OK;
}
