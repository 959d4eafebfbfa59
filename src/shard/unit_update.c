/* unit_update.c: the optimizer's arithmetic on a unit's buffers: AdamW or
 * SGD over the pieces of the optimizer's range (per parameter, for weight
 * decay), writing the new compute-dtype values in the same pass; the fp32
 * to compute-dtype cast; the grad sum of squares on a GPU. On CPU ranks and
 * for offloaded units these run on the host (src/shard/adamw.c), on GPUs as
 * kernels on the shard group's stream. Both the in-place step (unit_apply.c)
 * and the offloaded one (offload.c) come here, so neither calls the other. */
#include <string.h>

#include "../base/bf16_split.h"
#include "../base/error.h"
#include "../device/cuda_backend.h"
#include "../fsdp_shard.h"
#include "unit_impl.h"

int fsdp_unit_cast_out(void *dst, int dtype, const float *src, int64_t n, fsdp_stream *s) {
  if (s && s->device == FSDP_CUDA) return fsdp_cuda()->cast_from_f32(dst, dtype, src, (size_t)n, s);
  if (dtype == FSDP_FP32) {
    memcpy(dst, src, (size_t)n * 4);
  } else {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = fsdp_bf16_round_away(src[i]); /* the params' rule */
  }
  return FSDP_OK;
}

int fsdp_unit_norm_on_device(fsdp_unit *u, const void *g, int dtype, int64_t n, fsdp_stream *s) {
  FSDP_CHECK(fsdp_memset(u->norm_device, 0, 16, s));
  FSDP_CHECK(fsdp_cuda()->sum_squares(g, dtype, n, (double *)u->norm_device, (int64_t *)u->norm_device + 1, s));
  u->norm_pending = 1;
  return FSDP_OK;
}

/* the compute-dtype output of an update: the host loops write bf16 (fp32
 * is copied after them), the kernels either */
static uint16_t *stage_bf16(const fsdp_unit *u, const fsdp_step_args *a, int64_t off) {
  return a->stage && u->cfg.compute_dtype == FSDP_BF16 ? (uint16_t *)a->stage + off : NULL;
}
static void *stage_at(const fsdp_unit *u, const fsdp_step_args *a, int64_t off) {
  return a->stage ? (char *)a->stage + (size_t)off * u->compute_size : NULL;
}

/* elements [off, off + len) of the optimizer's arrays, all of parameter
 * `param`; split main params are the stage (high halves) and main_low */
static int update(fsdp_unit *u, const fsdp_step_args *a, int64_t off, int64_t len, int param) {
  int on_gpu = u->device == FSDP_CUDA && !u->offload; /* offloaded: the host's arrays */
  float *p = u->main_params ? u->main_params + off : NULL, *m = u->opt1 + off;
  uint16_t *low = u->main_low ? u->main_low + off : NULL;
  int gd = u->main_grad_dtype;
  const void *g = (const char *)u->main_grads + (size_t)off * fsdp_dtype_size(gd);
  if (a->adamw) {
    fsdp_adamw_config c = *a->adamw;
    if (u->no_decay[param]) c.weight_decay = 0;
    if (on_gpu)
      return fsdp_cuda()->adamw_step(p, stage_at(u, a, off), u->cfg.compute_dtype, low, g, gd, m, u->opt2 + off, len,
                                     a->step, &c, a->grad_scale, u->shard_comm->stream);
    return fsdp_adamw_step(p, stage_bf16(u, a, off), low, g, gd, m, u->opt2 + off, len, a->step, &c, a->grad_scale);
  }
  float wd = u->no_decay[param] ? 0.0f : a->weight_decay;
  if (on_gpu)
    return fsdp_cuda()->sgd_step(p, stage_at(u, a, off), u->cfg.compute_dtype, low, g, gd, m, len, a->step, a->lr,
                                 a->momentum, wd, a->grad_scale, u->shard_comm->stream);
  return fsdp_sgd_step(p, stage_bf16(u, a, off), low, g, gd, m, len, a->step, a->lr, a->momentum, wd, a->grad_scale);
}

int fsdp_unit_update_pieces(fsdp_unit *u, const fsdp_step_args *a, const fsdp_layout_piece *ps, int k) {
  /* bf16, and the kernels: the update writes the stage itself */
  int copy = a->stage && u->cfg.compute_dtype == FSDP_FP32 && (u->device == FSDP_CPU || u->offload);
  for (int j = 0; j < k; j++) {
    int64_t off = ps[j].shard_offset, len = ps[j].end - ps[j].begin;
    FSDP_CHECK(update(u, a, off, len, ps[j].param));
    if (copy) memcpy((float *)a->stage + off, u->main_params + off, (size_t)len * sizeof(float));
  }
  return FSDP_OK;
}
