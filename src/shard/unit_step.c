/* unit_step.c: after the backward: the grad norm (queued behind each
 * unit's last reduction, read once), zero_grad, and the optimizer step's
 * entry points (AdamW, SGD): their arguments and the unit's state checked,
 * the step then applied by unit_apply.c (in place: kernels on the shard
 * group's stream on a GPU, the host's loops on CPU ranks; offloaded: a job
 * on the host stream, offload.c), at once or at the unit's next use. */
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "../base/heartbeat.h"
#include "../fsdp_shard.h"
#include "unit_impl.h"

/* ---- the grad norm ---- */

/* the grads the optimizer reads, this rank's part of the norm: zero 0 holds
 * full grads everywhere, so only this rank's slice counts, and the sum over
 * the shard group is the total for every zero level */
static void norm_range(const fsdp_unit *u, const void **g, int64_t *n) {
  size_t at = u->cfg.zero == 0 ? (size_t)u->shard_rank * (size_t)u->shard_numel : 0;
  *g = (const char *)u->main_grads + at * fsdp_dtype_size(u->main_grad_dtype);
  *n = u->cfg.zero == 0 ? u->shard_numel : u->opt_numel;
}

static int host_norm(void *arg) {
  fsdp_unit *u = arg;
  const void *g;
  int64_t n;
  norm_range(u, &g, &n);
  u->norm_status = fsdp_sum_squares(g, u->main_grad_dtype, n, &u->norm_sum, &u->norm_nonfinite);
  return u->norm_status;
}

/* the stream that writes the optimizer's grads last: the outer group's
 * when replicas reduce, else the reduce comm's */
static fsdp_stream *last_stream(const fsdp_unit *u) {
  return u->outer_comm ? u->outer_comm->stream : u->reduce_comm->stream;
}

int fsdp_unit_grad_norm_start(fsdp_unit *u) {
  if (!u) return fsdp_fail(FSDP_EINVAL, "unit_grad_norm_start: NULL unit");
  FSDP_CHECK(fsdp_unit_placed_check(u, 1, "grad_norm_start()"));
  fsdp_stream *s = last_stream(u);
  if (u->device == FSDP_CPU) { /* a task behind the reduction on the comm worker */
    u->norm_status = FSDP_OK;
    FSDP_CHECK(fsdp_cpu_stream_enqueue(s, host_norm, u, NULL));
    u->norm_pending = 1;
    return FSDP_OK;
  }
  if (u->offload) return FSDP_OK; /* summed on the device before the grads go down (offload.c) */
  const void *g;
  int64_t n;
  norm_range(u, &g, &n);
  return fsdp_unit_norm_on_device(u, g, u->main_grad_dtype, n, s);
}

int fsdp_unit_grad_norm_get(fsdp_unit *u, double *sum, int64_t *nonfinite) {
  if (!u || !sum || !nonfinite) return fsdp_fail(FSDP_EINVAL, "unit_grad_norm_get: NULL argument");
  FSDP_CHECK(fsdp_unit_placed_check(u, 1, "grad_norm_get()"));
  FSDP_CHECK(fsdp_unit_synchronize(u));
  int pending = u->norm_pending;
  u->norm_pending = 0;
  if (u->device == FSDP_CPU && pending) {
    *sum = u->norm_sum;
    *nonfinite = u->norm_nonfinite;
    return u->norm_status;
  }
  if (u->device == FSDP_CPU || (u->offload && !pending)) {
    const void *g;
    int64_t n;
    norm_range(u, &g, &n);
    return fsdp_sum_squares(g, u->main_grad_dtype, n, sum, nonfinite);
  }
  if (!pending) FSDP_CHECK(fsdp_unit_grad_norm_start(u)); /* not offloaded here */
  u->norm_pending = 0;
  /* the kernel ran on a comm stream, which the default stream does not wait for */
  FSDP_CHECK(fsdp_stream_synchronize(last_stream(u)));
  FSDP_CHECK(fsdp_memcpy(sum, u->norm_device, sizeof(double), NULL));
  return fsdp_memcpy(nonfinite, (char *)u->norm_device + 8, sizeof(int64_t), NULL);
}

int fsdp_unit_grad_sumsq(fsdp_unit *u, double *sum, int64_t *nonfinite) {
  return fsdp_unit_grad_norm_get(u, sum, nonfinite); /* started or not */
}

/* The squared norm of some parameters' reduced grads, this rank's part
 * (the norm range's pieces of those parameters): a tensor-parallel rank
 * counts the parameters every tp rank holds whole (replicated) once, not
 * once per rank, by taking their share out of its own (fsdp.shard). */
int fsdp_unit_grad_sumsq_params(fsdp_unit *u, const uint8_t *which, double *sum) {
  if (!u || !which || !sum) return fsdp_fail(FSDP_EINVAL, "unit_grad_sumsq_params: NULL argument");
  FSDP_CHECK(fsdp_unit_placed_check(u, 1, "grad_sumsq_params()"));
  FSDP_CHECK(fsdp_unit_synchronize(u));
  *sum = 0;
  size_t es = fsdp_dtype_size(u->main_grad_dtype);
  /* main_grads from shard offset `lo` on: zero 0 holds the full grads
   * (this rank's shard counts), zero 1-3 the optimizer's range */
  int64_t lo = u->cfg.zero == 0 ? 0 : u->opt_offset, hi = lo + (u->cfg.zero == 0 ? u->shard_numel : u->opt_numel);
  const char *base = (const char *)u->main_grads + (u->cfg.zero == 0 ? (size_t)u->shard_rank * (size_t)u->shard_numel * es : 0);
  int np = fsdp_layout_rank_pieces(u->layout, u->shard_rank, NULL, 0);
  if (np < 0) return np;
  fsdp_layout_piece *pc = malloc(sizeof *pc * (size_t)(np ? np : 1));
  if (!pc) return fsdp_fail(FSDP_ENOMEM, "unit_grad_sumsq_params: out of memory");
  fsdp_layout_rank_pieces(u->layout, u->shard_rank, pc, np);
  int on_host = u->device == FSDP_CPU || u->grads_on_host, rc = FSDP_OK;
  void *host = NULL;
  for (int k = 0; k < np && rc == FSDP_OK; k++) {
    if (!which[pc[k].param]) continue;
    int64_t a = pc[k].shard_offset, b = a + (pc[k].end - pc[k].begin);
    a = a > lo ? a : lo, b = b < hi ? b : hi;
    if (a >= b) continue;
    const void *g = base + (size_t)(a - lo) * es;
    if (!on_host) { /* (a GPU's: the few replicated params, copied down) */
      free(host);
      host = malloc((size_t)(b - a) * es);
      if (!host) { rc = fsdp_fail(FSDP_ENOMEM, "unit_grad_sumsq_params: out of memory"); break; }
      rc = fsdp_memcpy(host, g, (size_t)(b - a) * es, NULL);
      g = host;
    }
    double part = 0;
    int64_t bad = 0;
    if (rc == FSDP_OK) rc = fsdp_sum_squares(g, u->main_grad_dtype, b - a, &part, &bad);
    *sum += part;
  }
  free(host);
  free(pc);
  return rc;
}

/* ---- zeroing ---- */

/* A step dropped before its last reduce: what its backward wrote outside
 * the optimizer's grads goes too, or the next step would add to it: the
 * full grads (zero 0-1), a pooled grad buffer still held (zero 2-3). Done
 * before returning; the caller's compute stream has finished that
 * backward (as zero_grad's contract says). */
static int drop_unreduced(fsdp_unit *u) {
  if (u->grads_state != FSDP_GRADS_ACCUMULATING) return FSDP_OK;
  fsdp_stream *s = u->shard_comm->stream;
  if (u->cfg.zero <= 1 && u->grads_full)
    FSDP_CHECK(fsdp_memset(u->grads_full, 0, (size_t)u->total_numel * u->compute_size, s));
  if (u->grad_slot >= 0) {
    FSDP_CHECK(fsdp_pool_give_back(u->grad_pool, u->grad_slot, s));
    u->grad_slot = -1;
  }
  u->pooled_grads = NULL;
  return fsdp_stream_synchronize(s);
}

int fsdp_unit_zero_grad(fsdp_unit *u) {
  FSDP_CHECK(fsdp_unit_placed_check(u, 1, "zero_grad()"));
  FSDP_CHECK(fsdp_unit_synchronize(u));
  u->sum_pending = 0; /* a micro-batch sum begun (zero 0-1, fp32 sums) starts again */
  FSDP_CHECK(drop_unreduced(u));
  FSDP_CHECK(fsdp_unit_zero_main_grads(u));
  fsdp_unit_enter(u, UNIT_EV_ZERO_GRAD);
  return FSDP_OK;
}


/* ---- the step ---- */

/* The grads reduced and summed (the reductions waited for), then the step
 * applied now, or deferred to the unit's next use (unit_apply.c). */
static int step_owned(fsdp_unit *u, const fsdp_step_args *a) {
  fsdp_heartbeat_pulse(); /* each unit's update is progress: a large model's optimizer step takes long */
  FSDP_CHECK(fsdp_unit_check(u, UNIT_EV_STEP));
  FSDP_CHECK(fsdp_unit_synchronize(u));
  FSDP_CHECK(fsdp_unit_apply_step(u, a));
  fsdp_unit_enter(u, UNIT_EV_STEP);
  return FSDP_OK;
}

int fsdp_unit_step(fsdp_unit *u, int64_t step, const fsdp_adamw_config *cfg, float grad_scale) {
  if (!u || !cfg) return fsdp_fail(FSDP_EINVAL, "unit_step: NULL argument");
  FSDP_CHECK(fsdp_adamw_step(NULL, NULL, NULL, NULL, FSDP_FP32, NULL, NULL, 0, step, cfg, grad_scale)); /* the arguments, here */
  fsdp_step_args a = {.step = step, .grad_scale = grad_scale, .adamw = cfg};
  return step_owned(u, &a);
}

int fsdp_unit_step_sgd(fsdp_unit *u, int64_t step, float lr, float momentum, float weight_decay, float grad_scale) {
  if (!u) return fsdp_fail(FSDP_EINVAL, "unit_step_sgd: NULL unit");
  FSDP_CHECK(fsdp_sgd_step(NULL, NULL, NULL, NULL, FSDP_FP32, NULL, 0, step, lr, momentum, weight_decay, grad_scale));
  fsdp_step_args a = {.step = step, .grad_scale = grad_scale, .lr = lr, .momentum = momentum, .weight_decay = weight_decay};
  return step_owned(u, &a);
}
