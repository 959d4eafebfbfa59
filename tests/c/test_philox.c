/* test_philox: Philox-4x32-10 against the published known-answer vectors
 * (Random123's kat_vectors), and the fills' properties: a value depends only
 * on (seed, stream, index), so drawing a range in pieces equals drawing it
 * whole; moments of 1e6 draws within 5 standard errors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fsdp.h"

static void kat(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1, uint32_t e0,
                uint32_t e1, uint32_t e2, uint32_t e3) {
  const uint32_t c[4] = {c0, c1, c2, c3}, k[2] = {k0, k1};
  uint32_t o[4];
  fsdp_philox4x32_10(c, k, o);
  CHECK(o[0] == e0 && o[1] == e1 && o[2] == e2 && o[3] == e3);
  if (o[0] != e0) fprintf(stderr, "got %08x %08x %08x %08x\n", o[0], o[1], o[2], o[3]);
}

int main(void) {
  kat(0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u);
  kat(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0x408f276du, 0x41c83b0eu,
      0xa20bc7c6u, 0x6d5451fdu);
  kat(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u, 0xd16cfe09u, 0x94fdccebu,
      0x5001e420u, 0x24126ea1u);

  enum { N = 1000000 };
  float *all = malloc(N * 4), *part = malloc(N * 4);
  uint32_t sid = fsdp_rng_stream_id("model.layers.0.mlp.up_proj.weight");
  CHECK(sid == fsdp_rng_stream_id("model.layers.0.mlp.up_proj.weight"));
  CHECK(sid != fsdp_rng_stream_id("model.layers.1.mlp.up_proj.weight"));
  CHECK_OK(fsdp_rng_fill(all, FSDP_FP32, N, 1234, sid, 0, FSDP_RNG_NORMAL, 0.0, 0.02));
  /* the same range drawn in three uneven pieces, as three ranks would */
  CHECK_OK(fsdp_rng_fill(part, FSDP_FP32, 333, 1234, sid, 0, FSDP_RNG_NORMAL, 0.0, 0.02));
  CHECK_OK(fsdp_rng_fill(part + 333, FSDP_FP32, 500000, 1234, sid, 333, FSDP_RNG_NORMAL, 0.0, 0.02));
  CHECK_OK(fsdp_rng_fill(part + 500333, FSDP_FP32, N - 500333, 1234, sid, 500333, FSDP_RNG_NORMAL, 0.0, 0.02));
  CHECK(memcmp(all, part, N * 4) == 0);
  /* drawn on 1 thread and on 7 (fills split over CPU threads): the same bits */
  CHECK_OK(fsdp_cpu_threads_set(1));
  CHECK_OK(fsdp_rng_fill(part, FSDP_FP32, N, 1234, sid, 0, FSDP_RNG_NORMAL, 0.0, 0.02));
  CHECK(memcmp(all, part, N * 4) == 0);
  CHECK_OK(fsdp_cpu_threads_set(7));
  CHECK_OK(fsdp_rng_fill(part, FSDP_FP32, N, 1234, sid, 0, FSDP_RNG_NORMAL, 0.0, 0.02));
  CHECK(memcmp(all, part, N * 4) == 0);
  /* a value computed here by the formula in philox.c, in float64 */
  {
    const uint32_t key[2] = {1234u, sid}, ctr[4] = {777, 0, 0, 0};
    uint32_t w[4];
    fsdp_philox4x32_10(ctr, key, w);
    double u0 = ((double)(w[0] >> 8) + 0.5) / 16777216.0, u1 = ((double)(w[1] >> 8) + 0.5) / 16777216.0;
    CHECK(all[777] == (float)(0.02 * sqrt(-2.0 * log(u0)) * cos(6.283185307179586 * u1)));
  }
  double s = 0, s2 = 0;
  for (int i = 0; i < N; i++) {
    s += all[i];
    s2 += (double)all[i] * all[i];
  }
  double mean = s / N, var = s2 / N - mean * mean;
  CHECK(fabs(mean) < 5 * 0.02 / sqrt(N));
  CHECK(fabs(var - 0.0004) < 5 * 0.0004 * sqrt(2.0 / N));
  /* another seed or stream gives other numbers */
  CHECK_OK(fsdp_rng_fill(part, FSDP_FP32, 1000, 1235, sid, 0, FSDP_RNG_NORMAL, 0.0, 0.02));
  CHECK(memcmp(all, part, 1000 * 4) != 0);
  CHECK_OK(fsdp_rng_fill(part, FSDP_FP32, N, 7, 0, 0, FSDP_RNG_UNIFORM, -1.0, 1.0));
  s = 0;
  int in_range = 1;
  for (int i = 0; i < N; i++) {
    s += part[i];
    in_range &= part[i] > -1.0f && part[i] < 1.0f;
  }
  CHECK(in_range);
  CHECK(fabs(s / N) < 5 * sqrt(1.0 / 3.0 / N));
  uint16_t bf[8];
  CHECK_OK(fsdp_rng_fill(bf, FSDP_BF16, 8, 1234, sid, 0, FSDP_RNG_NORMAL, 0.0, 0.02));
  for (int i = 0; i < 8; i++) CHECK(bf[i] == fsdp_f32_to_bf16(all[i]));
  CHECK_FAILS(fsdp_rng_fill(part, FSDP_FP32, 1, 1, 0, 0, 9, 0, 1), FSDP_EINVAL, "unknown distribution");
  free(all);
  free(part);
  return fsdp_test_summary("test_philox");
}
