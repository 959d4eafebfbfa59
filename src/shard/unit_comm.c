/* unit_comm.c: a unit's collectives and the work that must follow them, on
 * the comm streams: unshard (all-gather into a pooled full buffer), wait,
 * reshard; views of a parameter in the full buffers; grads (a pooled full
 * grad buffer) and reduce (reduce-scatter or all-reduce, then across HSDP
 * replicas), synchronize. Each first settles the unit (a deferred or
 * offloaded step before its values are read: unit_apply.c).
 *
 * Gathers run on the shard group's stream, reductions on the reduce comm's
 * (the same members on another channel, so the backward's prefetch is not
 * queued behind reductions). The host work after a collective (accumulate
 * a micro-batch into the fp32 shard, cast, zero) is enqueued on that same
 * stream: a task on the comm worker on CPU ranks, a kernel on a GPU; so
 * nothing here blocks the caller. The comm-stream time stamps
 * (fsdp_unit_times) are taken on CPU ranks only. */
#include <stdlib.h>
#include <string.h>

#include "../base/bf16.h"
#include "../base/error.h"
#include "../base/heartbeat.h"
#include "../device/cuda_backend.h"
#include "../fsdp_shard.h"
#include "unit_impl.h"

/* ---- host steps enqueued behind collectives ---- */

enum { OP_ADD = 0, OP_SET = 1, OP_ZERO = 2 };

typedef struct host_op {
  int op;     /* OP_ADD: dst(fp32) += src(dtype); OP_SET: dst = src; OP_ZERO: zero n bytes at dst */
  float *dst;
  const void *src;
  int dtype;
  int64_t n;
} host_op;

static int run_host_op(void *arg) {
  host_op *o = arg;
  if (o->op == OP_ZERO) {
    memset(o->dst, 0, (size_t)o->n);
    return FSDP_OK;
  }
  if (o->dtype == FSDP_FP32) {
    const float *s = o->src;
    if (o->op == OP_ADD)
      for (int64_t i = 0; i < o->n; i++) o->dst[i] += s[i];
    else
      memcpy(o->dst, s, (size_t)o->n * 4);
  } else {
    const uint16_t *s = o->src;
    if (o->op == OP_ADD)
      for (int64_t i = 0; i < o->n; i++) o->dst[i] += fsdp_bf16_load(s[i]);
    else
      for (int64_t i = 0; i < o->n; i++) o->dst[i] = fsdp_bf16_load(s[i]);
  }
  return FSDP_OK;
}

/* the op behind stream s's collectives: a task on CPU ranks, a kernel on a GPU */
static int enqueue(fsdp_stream *s, int op, void *dst, const void *src, int dtype, int64_t n) {
  if (s->device == FSDP_CUDA) {
    if (op == OP_ZERO) return fsdp_memset(dst, 0, (size_t)n, s);
    if (op == OP_SET && dtype == FSDP_FP32) return fsdp_memcpy(dst, src, (size_t)n * 4, s);
    if (op == OP_SET) return fsdp_cuda()->cast_to_f32(dst, src, dtype, (size_t)n, s);
    return fsdp_cuda()->accumulate_f32(dst, src, dtype, (size_t)n, s);
  }
  host_op *o = malloc(sizeof *o);
  if (!o) return fsdp_fail(FSDP_ENOMEM, "unit: out of memory");
  *o = (host_op){op, dst, src, dtype, n};
  return fsdp_cpu_stream_enqueue(s, run_host_op, o, free);
}

/* the comm stream writes the time it reaches this point (the schedule's
 * evidence of overlap in time, not only in issue order) */
static int stamp(void *arg) {
  *(double *)arg = fsdp_time_now();
  return FSDP_OK;
}
static int enqueue_stamp(fsdp_stream *s, double *where) {
  return s->device == FSDP_CPU ? fsdp_cpu_stream_enqueue(s, stamp, where, NULL) : FSDP_OK;
}

/* Where a gather or reduction begins (end = 0) and ends on stream s: the
 * time stamp, and the probe's timed event (fsdp_unit_probe) if one is set,
 * on CPU ranks and GPUs alike; the probe is used once. */
static int mark(fsdp_unit *u, int which, int end, fsdp_stream *s) {
  double *t = which == FSDP_PROBE_GATHER ? (end ? &u->times.gather_end : &u->times.gather_begin)
                                         : (end ? &u->times.reduce_end : &u->times.reduce_begin);
  FSDP_CHECK(enqueue_stamp(s, t));
  fsdp_event *e = u->probe[which][end];
  if (!e) return FSDP_OK;
  FSDP_CHECK(fsdp_event_record(e, s));
  if (end) {
    u->probe[which][0] = u->probe[which][1] = NULL;
    u->probe_used[which] = 1;
  }
  return FSDP_OK;
}

int fsdp_unit_probe(fsdp_unit *u, int which, fsdp_event *begin, fsdp_event *end) {
  if (!u) return fsdp_fail(FSDP_EINVAL, "unit_probe: NULL unit");
  if (which != FSDP_PROBE_GATHER && which != FSDP_PROBE_REDUCE)
    return fsdp_fail(FSDP_EINVAL, "unit '%s': probe kind %d (expected FSDP_PROBE_GATHER or FSDP_PROBE_REDUCE)", u->name,
                     which);
  if ((begin == NULL) != (end == NULL))
    return fsdp_fail(FSDP_EINVAL, "unit '%s': a probe needs both events, or neither", u->name);
  if (begin && (begin->device != u->device || end->device != u->device))
    return fsdp_fail(FSDP_EINVAL, "unit '%s': the probe's events are not on the unit's device", u->name);
  int used = u->probe_used[which];
  u->probe_used[which] = 0;
  u->probe[which][0] = begin;
  u->probe[which][1] = end;
  return used;
}

/* ---- forward: params ---- */

int fsdp_unit_unshard(fsdp_unit *u) {
  fsdp_heartbeat_pulse(); /* a unit reached is progress, even where no collective runs (one rank) */
  FSDP_CHECK(fsdp_unit_placed_check(u, 0, "unshard()"));
  FSDP_CHECK(fsdp_unit_settle(u));
  if (u->params_state != FSDP_PARAMS_SHARDED) return FSDP_OK; /* resident, or on its way */
  fsdp_stream *cs = u->shard_comm->stream;
  size_t c = u->compute_size;
  if (!u->plan.pool_params) { /* one rank holds the whole unit: its shard is the full params */
    u->gathered_params = u->param_shard;
    fsdp_unit_enter(u, UNIT_EV_UNSHARD);
    FSDP_CHECK(mark(u, FSDP_PROBE_GATHER, 0, cs));
    FSDP_CHECK(mark(u, FSDP_PROBE_GATHER, 1, cs));
    return fsdp_event_record(u->gathered, cs); /* after the step's last writes to it */
  }
  void *full = NULL;
  int rc = fsdp_pool_acquire(u->param_pool, (size_t)u->total_numel * c, cs, &u->param_slot, &full);
  if (rc != FSDP_OK) return rc; /* FSDP_DEFERRED: at the bound */
  u->gathered_params = full;
  fsdp_unit_enter(u, UNIT_EV_UNSHARD);
  FSDP_CHECK(mark(u, FSDP_PROBE_GATHER, 0, cs));
  const void *in = u->param_shard;
  if (u->params_on_host) { /* the shard lives on the host: up into the comm's staging, in stream order */
    FSDP_CHECK(fsdp_memcpy(u->shard_comm->scratch, u->host_stage, (size_t)u->shard_numel * c, cs));
    in = u->shard_comm->scratch;
  }
  FSDP_CHECK(fsdp_comm_all_gather(u->shard_comm, full, in, (size_t)u->shard_numel, u->cfg.compute_dtype));
  FSDP_CHECK(mark(u, FSDP_PROBE_GATHER, 1, cs));
  return fsdp_event_record(u->gathered, cs);
}

int fsdp_unit_prefetch(fsdp_unit *u) {
  int busy = fsdp_offload_busy(u);
  FSDP_CHECK(busy);
  return busy ? FSDP_DEFERRED : fsdp_unit_unshard(u);
}

int fsdp_unit_wait(fsdp_unit *u, fsdp_stream *compute) {
  FSDP_CHECK(fsdp_unit_settle(u));
  FSDP_CHECK(fsdp_unit_check(u, UNIT_EV_WAIT));
  FSDP_CHECK(fsdp_stream_wait_event(compute, u->gathered));
  fsdp_unit_enter(u, UNIT_EV_WAIT);
  return FSDP_OK;
}

int fsdp_unit_reshard(fsdp_unit *u, fsdp_stream *compute) {
  if (u->params_state == FSDP_PARAMS_RESIDENT || u->params_state == FSDP_PARAMS_SHARDED) return FSDP_OK;
  u->gathered_params = NULL;
  fsdp_unit_enter(u, UNIT_EV_RESHARD);
  if (u->param_slot < 0) return FSDP_OK; /* it was the shard */
  int rc = fsdp_pool_give_back(u->param_pool, u->param_slot, compute);
  u->param_slot = -1;
  return rc;
}

/* ---- views into the full buffers ---- */

void *fsdp_unit_params(fsdp_unit *u) { return u->cfg.zero == 3 ? u->gathered_params : u->params_full; }

int fsdp_unit_param_view(fsdp_unit *u, int param, int which, int ndim, const int64_t *shape, fsdp_tensor *out) {
  if (!u || !out) return fsdp_fail(FSDP_EINVAL, "unit_param_view: NULL unit or out");
  FSDP_CHECK(fsdp_unit_placed_check(u, which == FSDP_VIEW_GRAD, "param_view()"));
  FSDP_CHECK(fsdp_unit_settle(u));
  if (param < 0 || param >= u->nparams)
    return fsdp_fail(FSDP_EINVAL, "unit '%s': parameter %d does not exist (it has %d)", u->name, param, u->nparams);
  if (which != FSDP_VIEW_PARAM && which != FSDP_VIEW_GRAD)
    return fsdp_fail(FSDP_EINVAL, "unit '%s': view kind %d (expected FSDP_VIEW_PARAM or FSDP_VIEW_GRAD)", u->name, which);
  if (which == FSDP_VIEW_PARAM && u->params_state == FSDP_PARAMS_GATHERING)
    return fsdp_fail(FSDP_ESTATE, "unit '%s': the full params are still being gathered (wait() first)", u->name);
  void *buf = which == FSDP_VIEW_PARAM ? fsdp_unit_params(u) : (u->cfg.zero <= 1 ? u->grads_full : u->pooled_grads);
  if (!buf)
    return fsdp_fail(FSDP_ESTATE, "unit '%s': the full %s are not there (%s first)", u->name,
                     which == FSDP_VIEW_PARAM ? "params" : "grads",
                     which == FSDP_VIEW_PARAM ? "unshard and wait" : "take the grad buffer with fsdp_unit_grads");
  /* the whole flat buffer as a tensor, then the parameter's range of it */
  fsdp_tensor flat = {.data = buf, .dtype = u->cfg.compute_dtype, .device = u->device, .ndim = 1, .owns = 0,
                      .shape = {u->total_numel, 1, 1, 1}};
  int64_t numel = 1;
  for (int i = 0; shape && i < ndim && i < 4; i++) numel *= shape[i];
  if (shape && ndim >= 1 && ndim <= 4 && numel != u->numels[param])
    return fsdp_fail(FSDP_EINVAL, "unit '%s': parameter %d has %lld elements; the view's shape has %lld", u->name, param,
                     (long long)u->numels[param], (long long)numel);
  return fsdp_tensor_view(out, &flat, fsdp_layout_param_offset(u->layout, param), ndim, shape);
}

/* ---- backward: grads ---- */

/* compact grads that the backward writes itself (the full grads, or the
 * optimizer's when one rank holds the unit): after the step has zeroed them */
static int compact_written_by_compute(const fsdp_unit *u) {
  return u->grads_compact && (u->cfg.zero <= 1 ? u->main_grads == u->grads_full : !u->plan.pool_grads);
}

static int take_grads(fsdp_unit *u, fsdp_stream *compute, void **out) {
  FSDP_CHECK(fsdp_unit_settle(u));
  if (compact_written_by_compute(u) && u->grads_zeroed) FSDP_CHECK(fsdp_stream_wait_event(compute, u->grads_zeroed));
  if (u->grads_free) FSDP_CHECK(fsdp_stream_wait_event(compute, u->grads_free)); /* the last micro-batch's, added in */
  if (u->cfg.zero <= 1) {
    *out = u->grads_full;
    return FSDP_OK;
  }
  if (compact_written_by_compute(u)) { /* zero 2-3 alone: the optimizer's grads, no pooled buffer */
    *out = u->pooled_grads = u->main_grads;
    return FSDP_OK;
  }
  if (u->grad_slot < 0) {
    size_t bytes = (size_t)u->total_numel * u->compute_size;
    int rc = fsdp_pool_acquire(u->grad_pool, bytes, compute, &u->grad_slot, &u->pooled_grads);
    if (rc == FSDP_DEFERRED)
      return fsdp_fail(FSDP_ESTATE, "unit '%s': every grad buffer is in use (raise max_live_units, or reduce units "
                       "before taking more)", u->name);
    FSDP_CHECK(rc);
    FSDP_CHECK(fsdp_memset(u->pooled_grads, 0, bytes, compute));
  }
  *out = u->pooled_grads;
  return FSDP_OK;
}

int fsdp_unit_grads(fsdp_unit *u, fsdp_stream *compute, void **out) {
  FSDP_CHECK(fsdp_unit_check(u, UNIT_EV_GRADS));
  FSDP_CHECK(take_grads(u, compute, out));
  fsdp_unit_enter(u, UNIT_EV_GRADS);
  return FSDP_OK;
}

/* reduce-scatter `full` (dtype cd) into fp32 `dst`; accumulate adds instead of writing */
static int reduce_scatter_into(fsdp_unit *u, float *dst, const void *full, int cd, int accumulate) {
  fsdp_comm *c = u->reduce_comm;
  int rd = u->cfg.reduce_dtype;
  size_t S = (size_t)u->shard_numel;
  if (u->shard_ranks == 1) /* nothing to exchange: the full grads are this rank's shard */
    return enqueue(c->stream, accumulate ? OP_ADD : OP_SET, dst, full, cd, u->shard_numel);
  if (!accumulate && rd == FSDP_FP32 && !u->grads_on_host) /* (not into host memory: through the scratch) */
    return fsdp_comm_reduce_scatter(c, dst, FSDP_FP32, full, cd, S, u->cfg.grad_op);
  float *scratch = fsdp_unit_reduce_scratch(u);
  FSDP_CHECK(fsdp_comm_reduce_scatter(c, scratch, rd, full, cd, S, u->cfg.grad_op));
  return enqueue(c->stream, accumulate ? OP_ADD : OP_SET, dst, scratch, rd, u->shard_numel);
}

/* HSDP, after the last micro-batch: the replicas' grad shards agree, on the
 * outer group's stream behind the shard group's reduction */
static int reduce_outer(fsdp_unit *u) {
  fsdp_comm *o = u->outer_comm;
  FSDP_CHECK(fsdp_event_record(u->handoff, u->reduce_comm->stream));
  FSDP_CHECK(fsdp_stream_wait_event(o->stream, u->handoff));
  if (u->offload) /* the device accumulator; it goes down to the host afterwards */
    return fsdp_comm_all_reduce(o, u->grad_accum, u->grad_accum, (size_t)u->opt_numel, FSDP_FP32, u->cfg.grad_op);
  if (u->hfsdp) { /* each replica keeps 1/R of the shard's grads */
    FSDP_CHECK(fsdp_comm_reduce_scatter(o, u->main_grads, FSDP_FP32, u->grad_accum, FSDP_FP32, (size_t)u->opt_numel,
                                        u->cfg.grad_op));
    return enqueue(o->stream, OP_ZERO, u->grad_accum, NULL, 0, u->shard_numel * (int64_t)sizeof(float));
  }
  return fsdp_comm_all_reduce(o, u->main_grads, u->main_grads, (size_t)u->opt_numel, FSDP_FP32, u->cfg.grad_op);
}

/* compact grads: the reduction's bf16 output is what the optimizer reads
 * (one micro-batch, so nothing accumulates); zero 0 reduces in place */
static int reduce_compact(fsdp_unit *u) {
  fsdp_comm *c = u->reduce_comm;
  int z = u->cfg.zero, cd = u->cfg.compute_dtype;
  size_t S = (size_t)u->shard_numel, T = (size_t)u->total_numel;
  if (z == 0) return u->shard_ranks == 1 ? FSDP_OK : fsdp_comm_all_reduce(c, u->grads_full, u->grads_full, T, cd, u->cfg.grad_op);
  if (compact_written_by_compute(u)) { /* one rank: the backward wrote them */
    u->pooled_grads = NULL;
    return FSDP_OK;
  }
  const void *full = z == 1 ? u->grads_full : u->pooled_grads;
  FSDP_CHECK(fsdp_comm_reduce_scatter(c, u->main_grads, cd, full, cd, S, u->cfg.grad_op));
  if (z == 1) return enqueue(c->stream, OP_ZERO, u->grads_full, NULL, 0, (int64_t)(T * u->compute_size));
  FSDP_CHECK(fsdp_pool_give_back(u->grad_pool, u->grad_slot, c->stream));
  u->grad_slot = -1;
  u->pooled_grads = NULL;
  return FSDP_OK;
}

/* zero 0-1, fp32 sums: each micro-batch's full grads are added into the
 * fp32 sum (zero 0: the full main grads) and zeroed for the next one,
 * which waits for that (grads_free); the last reduces the sum in fp32.
 * (A step of one micro-batch has nothing to add up: the plain path.) */
static int reduce_sums(fsdp_unit *u, int sync) {
  fsdp_comm *c = u->reduce_comm;
  int64_t T = u->total_numel;
  float *sum = u->cfg.zero == 0 ? u->main_grads : u->grads_sum;
  FSDP_CHECK(enqueue(c->stream, u->sum_pending ? OP_ADD : OP_SET, sum, u->grads_full, u->cfg.compute_dtype, T));
  FSDP_CHECK(enqueue(c->stream, OP_ZERO, u->grads_full, NULL, 0, T * (int64_t)u->compute_size));
  u->sum_pending = !sync;
  if (!sync) return fsdp_event_record(u->grads_free, c->stream);
  if (u->cfg.zero == 0) return fsdp_comm_all_reduce(c, sum, sum, (size_t)T, FSDP_FP32, u->cfg.grad_op);
  return reduce_scatter_into(u, u->grad_accum, sum, FSDP_FP32, 0);
}

static int reduce(fsdp_unit *u, fsdp_stream *compute, int sync) {
  fsdp_comm *c = u->reduce_comm;
  int z = u->cfg.zero, cd = u->cfg.compute_dtype;
  if (z <= 1 && !sync && !u->sums_fp32) return FSDP_OK; /* accumulate in the full grads */
  if (z >= 2 && (u->grads_compact ? !u->pooled_grads : u->grad_slot < 0))
    return fsdp_fail(FSDP_ESTATE, "unit '%s': reduce() without grads()", u->name);
  FSDP_CHECK(fsdp_unit_settle(u));
  FSDP_CHECK(fsdp_offload_before_reduce(u));
  if (u->grads_zeroed) FSDP_CHECK(fsdp_stream_wait_event(c->stream, u->grads_zeroed)); /* the last step's, on shard */
  FSDP_CHECK(fsdp_event_record(u->handoff, compute));
  FSDP_CHECK(fsdp_stream_wait_event(c->stream, u->handoff));
  FSDP_CHECK(mark(u, FSDP_PROBE_REDUCE, 0, c->stream));
  int64_t T = u->total_numel, gbytes = T * (int64_t)u->compute_size;
  if (u->reduce_path == UNIT_REDUCE_COMPACT) {
    FSDP_CHECK(reduce_compact(u));
  } else if (u->sums_fp32 && (u->sum_pending || !sync)) {
    FSDP_CHECK(reduce_sums(u, sync));
  } else if (u->reduce_path == UNIT_REDUCE_ALL_REDUCE) {
    if (u->cfg.reduce_dtype == FSDP_FP32) {
      FSDP_CHECK(enqueue(c->stream, OP_SET, u->main_grads, u->grads_full, cd, T));
      FSDP_CHECK(fsdp_comm_all_reduce(c, u->main_grads, u->main_grads, (size_t)T, FSDP_FP32, u->cfg.grad_op));
    } else {
      FSDP_CHECK(fsdp_comm_all_reduce(c, u->grads_full, u->grads_full, (size_t)T, cd, u->cfg.grad_op));
      FSDP_CHECK(enqueue(c->stream, OP_SET, u->main_grads, u->grads_full, cd, T));
    }
    FSDP_CHECK(enqueue(c->stream, OP_ZERO, u->grads_full, NULL, 0, gbytes));
  } else if (u->reduce_path == UNIT_REDUCE_SCATTER_FULL) {
    FSDP_CHECK(reduce_scatter_into(u, u->grad_accum, u->grads_full, cd, 0));
    FSDP_CHECK(enqueue(c->stream, OP_ZERO, u->grads_full, NULL, 0, gbytes));
  } else { /* UNIT_REDUCE_SCATTER_EACH */
    /* every micro-batch: accumulation stays sharded, in fp32 */
    FSDP_CHECK(reduce_scatter_into(u, u->grad_accum, u->pooled_grads, cd, 1));
    FSDP_CHECK(fsdp_pool_give_back(u->grad_pool, u->grad_slot, c->stream));
    u->grad_slot = -1;
    u->pooled_grads = NULL;
  }
  FSDP_CHECK(mark(u, FSDP_PROBE_REDUCE, 1, c->stream));
  if (!sync || u->grads_on_host) return FSDP_OK; /* offloaded grads: in host memory already */
  if (u->outer_comm && !u->grads_compact) FSDP_CHECK(reduce_outer(u)); /* (compact: one replica) */
  if (!u->offload) return FSDP_OK;
  /* offload: copy the reduced grads down for the host step */
  fsdp_stream *s = u->outer_comm ? u->outer_comm->stream : c->stream;
  u->grads_stale = 0;
  if (u->device == FSDP_CUDA) return fsdp_offload_grads_down(u, s); /* on the transfer stream */
  FSDP_CHECK(enqueue(s, OP_SET, u->main_grads, u->grad_accum, FSDP_FP32, u->opt_numel));
  return enqueue(s, OP_ZERO, u->grad_accum, NULL, 0, u->shard_numel * (int64_t)sizeof(float)); /* next step from 0 */
}

int fsdp_unit_reduce(fsdp_unit *u, fsdp_stream *compute, int sync) {
  fsdp_heartbeat_pulse(); /* progress within a long backward */
  if (u->grads_compact && !sync)
    return fsdp_fail(FSDP_ESTATE, "unit '%s': reduce() for a micro-batch before the last, but the unit was made for one "
                     "micro-batch per step (micro_batches = 1: its grads are kept in bf16, with no fp32 sum)", u->name);
  unit_event e = sync ? UNIT_EV_REDUCE_LAST : UNIT_EV_REDUCE_PART;
  FSDP_CHECK(fsdp_unit_check(u, e));
  FSDP_CHECK(reduce(u, compute, sync));
  fsdp_unit_enter(u, e);
  return FSDP_OK;
}

int fsdp_unit_synchronize(fsdp_unit *u) {
  FSDP_CHECK(fsdp_unit_settle(u));
  FSDP_CHECK(fsdp_comm_synchronize(u->shard_comm));
  if (u->reduce_comm != u->shard_comm) FSDP_CHECK(fsdp_comm_synchronize(u->reduce_comm));
  if (u->outer_comm) FSDP_CHECK(fsdp_comm_synchronize(u->outer_comm));
  return fsdp_offload_synchronize(u);
}
