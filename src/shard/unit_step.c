/* unit_step.c: after the backward: the grad norm (queued behind each
 * unit's last reduction, read once), the optimizer step on what this rank
 * owns, and publishing the new params to the compute copies. The step runs
 * in place (kernels on the shard group's stream on a GPU, the host's loops
 * on CPU ranks), or, offloaded, as a job on the host stream (offload.c);
 * both update through unit_update.c. */
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

/* ---- zeroing and publishing ---- */

static int zero_main_grads(fsdp_unit *u) {
  size_t bytes = (size_t)u->opt_numel * fsdp_dtype_size(u->main_grad_dtype);
  if (u->device == FSDP_CUDA && !u->offload) { /* behind the optimizer's kernels on the shard stream */
    FSDP_CHECK(fsdp_memset(u->main_grads, 0, bytes, u->shard_comm->stream));
    return u->grads_zeroed ? fsdp_event_record(u->grads_zeroed, u->shard_comm->stream) : FSDP_OK;
  }
  memset(u->main_grads, 0, bytes);
  return FSDP_OK;
}

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
  FSDP_CHECK(fsdp_unit_synchronize(u));
  u->sum_pending = 0; /* a micro-batch sum begun (zero 0-1, fp32 sums) starts again */
  FSDP_CHECK(drop_unreduced(u));
  FSDP_CHECK(zero_main_grads(u));
  fsdp_unit_enter(u, UNIT_EV_ZERO_GRAD);
  return FSDP_OK;
}

/* The compute-dtype params from the fp32 main params: after an optimizer
 * step, or after a checkpoint load set the main params. Zero 0 casts the
 * full copy; zero >= 1 casts the shard (HFSDP: all-gathers the replicas'
 * ranges into it) and, for the resident levels, all-gathers the full
 * params. cast = 0 where the step wrote the compute params already. */
static int publish(fsdp_unit *u, int cast) {
  fsdp_stream *s = u->shard_comm->stream;
  int dt = u->cfg.compute_dtype;
  if (u->cfg.zero == 0) {
    if (cast) FSDP_CHECK(fsdp_unit_cast_out(u->params_full, dt, u->main_params, u->total_numel, s));
    /* the compute stream reads params_full after this event (fsdp_unit_wait) */
    return fsdp_event_record(u->gathered, s);
  }
  if (u->hfsdp) { /* gather the replicas' ranges into the compute shard (no reduction runs: the scratch is free) */
    float *scratch = fsdp_unit_reduce_scratch(u);
    FSDP_CHECK(fsdp_unit_cast_out(scratch, dt, u->main_params, u->opt_numel, s));
    if (u->device == FSDP_CUDA) FSDP_CHECK(fsdp_stream_synchronize(s));
    FSDP_CHECK(fsdp_comm_all_gather(u->outer_comm, u->param_shard, scratch, (size_t)u->opt_numel, dt));
    FSDP_CHECK(fsdp_comm_synchronize(u->outer_comm));
  } else if (u->host_stage) { /* offload on a GPU: cast on the host, one copy up (params on host: at each unshard) */
    FSDP_CHECK(fsdp_unit_cast_out(u->host_stage, dt, u->main_params, u->shard_numel, NULL));
    if (!u->params_on_host)
      FSDP_CHECK(fsdp_memcpy(u->param_shard, u->host_stage, (size_t)u->shard_numel * u->compute_size, s));
  } else if (cast) {
    FSDP_CHECK(fsdp_unit_cast_out(u->param_shard, dt, u->main_params, u->shard_numel, s));
  }
  if (u->cfg.zero <= 2) { /* resident full params: gather the new values */
    FSDP_CHECK(fsdp_comm_all_gather(u->shard_comm, u->params_full, u->param_shard, (size_t)u->shard_numel, dt));
    FSDP_CHECK(fsdp_event_record(u->gathered, s));
  }
  return FSDP_OK;
}

/* split main params: the compute params are their high halves already */
int fsdp_unit_publish_params(fsdp_unit *u) { return publish(u, !u->compute_is_main && !u->main_split); }

/* ---- the step ---- */

/* Update what this rank owns (zero 0: everything), write the new values
 * back to the compute params, and zero the grads. */
static int update_owned(fsdp_unit *u, const fsdp_step_args *a) {
  fsdp_layout_piece *ps = NULL;
  int k = fsdp_unit_owned_pieces(u, &ps);
  FSDP_CHECK(k);
  if (u->offload) return fsdp_offload_step(u, a, ps, k); /* takes ps, returns at once (offload.c) */
  fsdp_step_args in_place = *a;
  in_place.stage = fsdp_unit_inplace_stage(u);
  int rc = fsdp_unit_update_pieces(u, &in_place, ps, k);
  free(ps);
  FSDP_CHECK(rc);
  FSDP_CHECK(publish(u, 0)); /* the update wrote the compute params, or they are main (HFSDP still gathers) */
  return zero_main_grads(u);
}

static int step_owned(fsdp_unit *u, const fsdp_step_args *a) {
  fsdp_heartbeat_pulse(); /* each unit's update is progress: a large model's optimizer step takes long */
  FSDP_CHECK(fsdp_unit_check(u, UNIT_EV_STEP));
  FSDP_CHECK(fsdp_unit_synchronize(u));
  FSDP_CHECK(update_owned(u, a));
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
