/* test_comm_cast_chunks: the chunked bf16 -> fp32 reduce-scatter that the
 * NCCL transport runs (src/dist/comm_cast_chunks.c), its steps played on
 * the CPU for W simulated ranks: each rank's loop casts rows into its
 * staging block and "reduce-scatters" it; the test records every call and
 * afterwards does what NCCL does across ranks (rank r's out chunk = the sum
 * over ranks of their blocks' row r). The reference: each rank's plain
 * reduce-scatter, out_r[i] = sum over w of in_w[r * count + i], in float64;
 * bound 1e-6 of the largest sum (fp32 sums of at most 5 bf16 values).
 * Also the chunk sizes fsdp_comm_cast_chunk gives (the planner's staging). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/bf16.h"
#include "check.h"
#include "dist/comm_impl.h"
#include "fsdp.h"

enum { MAX_CALLS = 64 };

typedef struct call {
  size_t out_off, len;
  float *block; /* a copy of the staging block as the step saw it */
} call;

typedef struct rank_sim {
  const float *out_base;
  size_t rows_seen, stride_seen;
  int n;
  call calls[MAX_CALLS];
} rank_sim;

static int cast_rows(void *ctx, float *dst, const void *src, size_t rows, size_t cols, size_t stride) {
  rank_sim *s = ctx;
  const uint16_t *h = src;
  for (size_t r = 0; r < rows; r++)
    for (size_t i = 0; i < cols; i++) dst[r * cols + i] = fsdp_bf16_load(h[r * stride + i]);
  s->rows_seen = rows;
  s->stride_seen = stride;
  return FSDP_OK;
}

static int reduce_scatter(void *ctx, float *out, const float *in, size_t count) {
  rank_sim *s = ctx;
  if (s->n == MAX_CALLS) return FSDP_EINVAL; /* more chunks than any case here makes */
  call *c = &s->calls[s->n++];
  c->out_off = (size_t)(out - s->out_base);
  c->len = count;
  c->block = malloc(sizeof(float) * count * s->rows_seen);
  memcpy(c->block, in, sizeof(float) * count * s->rows_seen);
  return FSDP_OK;
}

static void run(int W, size_t count, size_t chunk) {
  uint16_t *in = malloc(sizeof(uint16_t) * (size_t)W * W * count); /* rank w's input at w * W * count */
  float *out = malloc(sizeof(float) * (size_t)W * count), *stage = malloc(sizeof(float) * (size_t)W * chunk);
  rank_sim *sim = calloc((size_t)W, sizeof *sim);
  uint32_t x = 12345;
  for (size_t i = 0; i < (size_t)W * W * count; i++) {
    x = x * 1664525u + 1013904223u;
    in[i] = fsdp_bf16_round(((float)(x >> 8) / 16777216.0f - 0.5f) * 8.0f);
  }
  for (size_t i = 0; i < (size_t)W * count; i++) out[i] = NAN; /* an element no chunk wrote shows */
  for (int w = 0; w < W; w++) {
    sim[w].out_base = out + (size_t)w * count;
    const comm_cast_steps steps = {&sim[w], cast_rows, reduce_scatter};
    CHECK_OK(fsdp_comm_cast_reduce_scatter(count, W, chunk, sizeof(uint16_t), stage, out + (size_t)w * count,
                                           in + (size_t)w * W * count, &steps));
    CHECK(sim[w].n == (int)((count + chunk - 1) / chunk));
    CHECK(sim[w].n == 0 || (sim[w].rows_seen == (size_t)W && sim[w].stride_seen == count));
  }
  /* NCCL's part: call k of every rank is one collective */
  for (int k = 0; k < sim[0].n; k++)
    for (int r = 0; r < W; r++) {
      const call *mine = &sim[r].calls[k];
      for (size_t j = 0; j < mine->len; j++) {
        float sum = 0;
        for (int w = 0; w < W; w++) sum += sim[w].calls[k].block[(size_t)r * mine->len + j];
        out[(size_t)r * count + mine->out_off + j] = sum;
      }
    }
  double worst = 0, scale = 0;
  for (int r = 0; r < W; r++)
    for (size_t i = 0; i < count; i++) {
      double ref = 0;
      for (int w = 0; w < W; w++) ref += fsdp_bf16_load(in[(size_t)w * W * count + (size_t)r * count + i]);
      double got = out[(size_t)r * count + i];
      worst = isfinite(got) ? fmax(worst, fabs(got - ref)) : INFINITY;
      scale = fmax(scale, fabs(ref));
    }
  CHECK(worst <= 1e-6 * scale);
  for (int w = 0; w < W; w++)
    for (int k = 0; k < sim[w].n; k++) free(sim[w].calls[k].block);
  free(sim);
  free(stage);
  free(out);
  free(in);
}

int main(void) {
  /* chunk sizes: the block is 64 Mi fp32 elements, but at least 1 Mi per rank */
  CHECK(fsdp_comm_cast_chunk(100, 8) == 100);
  CHECK(fsdp_comm_cast_chunk(64u << 20, 8) == 8u << 20);
  CHECK(fsdp_comm_cast_chunk(3u << 20, 512) == 1u << 20);
  CHECK(fsdp_comm_cast_chunk(0, 4) == 0);
  CHECK(fsdp_comm_cast_chunk(5, 0) == 5);
  /* the loop: one chunk, several with a short last one, chunks of 1 */
  run(2, 10, 10);
  run(3, 10, 4);
  run(5, 33, 7);
  run(4, 6, 1);
  run(1, 9, 2);
  run(3, 0, 5);
  float stage[4];
  const comm_cast_steps none = {NULL, cast_rows, reduce_scatter};
  CHECK(fsdp_comm_cast_reduce_scatter(4, 2, 0, 2, stage, stage, stage, &none) == FSDP_EINVAL); /* chunks of nothing */
  return fsdp_test_summary("test_comm_cast_chunks");
}
