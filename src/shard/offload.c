/* offload.c: the offloaded optimizer step, overlapped with compute.
 *
 * An offloaded unit keeps its fp32 main params, optimizer state and the
 * grads the optimizer reads in host memory, and steps on the CPU. That step
 * is long (it streams 16 bytes per owned parameter through the host's memory
 * bandwidth), so it does not run on the caller's thread: fsdp_unit_step
 * queues it on one host stream shared by every offloaded unit of the
 * process and returns. The units step in the order they were stepped (the
 * trainer steps them in forward order), and the next forward waits only
 * for the unit it is about to use:
 *
 *   host stream:     step u0 | step u1 | step u2 | ...
 *   transfer (CUDA):          up u0     up u1     up u2
 *   compute:                  (waits)   fwd u0    fwd u1    fwd u2
 *
 * The step writes the new values in the compute dtype into a staging shard
 * in the same pass (the compute shard itself on CPU ranks, pinned host
 * memory on a GPU). settle() is where the unit is used again (unshard,
 * wait, reduce, synchronize, its state read for a checkpoint...): on CPU
 * ranks the comm stream waits for the step's event, so nothing blocks; on
 * a GPU the caller waits for the host step, then the shard is copied up on
 * the transfer stream and the comm stream waits for that copy. The
 * resident levels (zero 1/2) then all-gather the new full params.
 *
 * Going down, the grads leave the device on the transfer stream after the
 * last reduction, so the next unit's reduce-scatter does not queue behind
 * the copy; the grad norm is summed on the device first. With the grads
 * offloaded too (FSDP_OFFLOAD_GRADS) there is no device grad shard: every
 * reduction lands in the host's through the comm's scratch, and the step
 * zeroes it after reading it.
 *
 * FSDP_TEST_HOST_STEP_DELAY_US delays each host step (tests show the
 * overlap with it). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "../fsdp_shard.h"
#include "unit_impl.h"

static struct {
  pthread_mutex_t lock;
  fsdp_stream *host, *xfer;
  int users;
  int64_t delay_us;
} shared = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int acquire(int device, fsdp_stream **host, fsdp_stream **xfer) {
  pthread_mutex_lock(&shared.lock);
  int rc = FSDP_OK;
  if (!shared.host) {
    rc = fsdp_stream_create(FSDP_CPU, &shared.host);
    const char *d = getenv("FSDP_TEST_HOST_STEP_DELAY_US");
    shared.delay_us = d ? atoll(d) : 0;
  }
  if (rc == FSDP_OK && device == FSDP_CUDA && !shared.xfer) rc = fsdp_stream_create(FSDP_CUDA, &shared.xfer);
  if (rc == FSDP_OK) {
    shared.users++;
    *host = shared.host;
    *xfer = device == FSDP_CUDA ? shared.xfer : NULL;
  }
  pthread_mutex_unlock(&shared.lock);
  return rc;
}

static void release(void) {
  pthread_mutex_lock(&shared.lock);
  if (--shared.users == 0) {
    fsdp_stream_destroy(shared.host); /* waits for queued steps */
    if (shared.xfer) fsdp_stream_destroy(shared.xfer);
    shared.host = shared.xfer = NULL;
  }
  pthread_mutex_unlock(&shared.lock);
}

int fsdp_offload_attach(fsdp_unit *u) {
  FSDP_CHECK(acquire(u->device, &u->host_stream, &u->xfer_stream));
  FSDP_CHECK(fsdp_event_create(FSDP_CPU, &u->step_done));
  if (u->device == FSDP_CUDA) {
    FSDP_CHECK(fsdp_event_create(FSDP_CUDA, &u->grads_reduced));
    FSDP_CHECK(fsdp_event_create(FSDP_CUDA, &u->grads_moved));
    FSDP_CHECK(fsdp_event_create(FSDP_CUDA, &u->shard_uploaded));
  }
  return FSDP_OK;
}

void fsdp_offload_detach(fsdp_unit *u) {
  if (!u->host_stream) return;
  (void)fsdp_event_synchronize(u->step_done); /* a queued step still writes into the unit */
  if (u->xfer_stream) (void)fsdp_stream_synchronize(u->xfer_stream);
  fsdp_event *evs[] = {u->step_done, u->grads_reduced, u->grads_moved, u->shard_uploaded};
  for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
    if (evs[i]) fsdp_event_destroy(evs[i]);
  u->step_done = u->grads_reduced = u->grads_moved = u->shard_uploaded = NULL;
  u->host_stream = u->xfer_stream = NULL;
  u->step_pending = 0;
  release();
}

/* ---- down: grads to the host ---- */

int fsdp_offload_grads_down(fsdp_unit *u, fsdp_stream *s) {
  /* the norm where the grads are, before they leave (n_opt == S: no hfsdp) */
  FSDP_CHECK(fsdp_unit_norm_on_device(u, u->grad_accum, FSDP_FP32, u->opt_numel, s));
  FSDP_CHECK(fsdp_event_record(u->grads_reduced, s));
  FSDP_CHECK(fsdp_stream_wait_event(u->xfer_stream, u->grads_reduced));
  FSDP_CHECK(fsdp_memcpy(u->main_grads, u->grad_accum, (size_t)u->opt_numel * sizeof(float), u->xfer_stream));
  FSDP_CHECK(fsdp_memset(u->grad_accum, 0, (size_t)u->shard_numel * sizeof(float), u->xfer_stream)); /* the next step accumulates from 0 */
  return fsdp_event_record(u->grads_moved, u->xfer_stream);
}

int fsdp_offload_before_reduce(fsdp_unit *u) {
  if (!u->xfer_stream) return FSDP_OK;
  FSDP_CHECK(fsdp_stream_wait_event(u->reduce_comm->stream, u->grads_moved));
  return u->outer_comm ? fsdp_stream_wait_event(u->outer_comm->stream, u->grads_moved) : FSDP_OK;
}

int fsdp_offload_synchronize(fsdp_unit *u) { return u->xfer_stream ? fsdp_event_synchronize(u->grads_moved) : FSDP_OK; }

/* ---- the step on the host stream ---- */

typedef struct step_job {
  fsdp_unit *u;
  fsdp_step_args a;
  fsdp_adamw_config adamw; /* the caller's config may not outlive the call */
  fsdp_layout_piece *ps;
  int k;
} step_job;

static int step_task(void *arg) {
  step_job *j = arg;
  fsdp_unit *u = j->u;
  u->times.step_begin = fsdp_time_now();
  int rc = fsdp_unit_update_pieces(u, &j->a, j->ps, j->k);
  /* grads offloaded: the reductions accumulate straight into gmain */
  if (rc == FSDP_OK && u->grads_on_host) memset(u->main_grads, 0, (size_t)u->opt_numel * sizeof(float));
  u->times.step_end = fsdp_time_now();
  return rc < 0 ? fsdp_fail_context(rc, "unit '%s': offloaded optimizer step", u->name) : FSDP_OK;
}

static void free_job(void *arg) {
  step_job *j = arg;
  free(j->ps);
  free(j);
}

int fsdp_offload_step(fsdp_unit *u, const fsdp_step_args *a, fsdp_layout_piece *ps, int k) {
  step_job *j = calloc(1, sizeof *j);
  if (!j) {
    free(ps);
    return fsdp_fail(FSDP_ENOMEM, "unit '%s': out of memory", u->name);
  }
  j->u = u;
  j->a = *a;
  j->ps = ps;
  j->k = k;
  if (a->adamw) {
    j->adamw = *a->adamw;
    j->a.adamw = &j->adamw;
  }
  j->a.stage = u->host_stage ? u->host_stage : u->param_shard;
  /* no reduce since the last step: the grads are zero, not the old ones */
  if (u->grads_stale) memset(u->main_grads, 0, (size_t)u->opt_numel * sizeof(float));
  if (shared.delay_us > 0) FSDP_CHECK(fsdp_stream_delay(u->host_stream, shared.delay_us));
  FSDP_CHECK(fsdp_cpu_stream_enqueue(u->host_stream, step_task, j, free_job));
  FSDP_CHECK(fsdp_event_record(u->step_done, u->host_stream));
  u->step_pending = 1;
  u->grads_stale = !u->grads_on_host; /* offg: the step zeroes them itself */
  return FSDP_OK;
}

int fsdp_offload_busy(fsdp_unit *u) {
  if (!u->step_pending || u->device != FSDP_CUDA) return 0; /* CPU ranks order it by events: never busy */
  int q = fsdp_event_query(u->step_done);
  return q < 0 ? q : !q;
}

int fsdp_offload_settle(fsdp_unit *u) {
  if (!u->step_pending) return FSDP_OK;
  u->step_pending = 0;
  fsdp_stream *cs = u->shard_comm->stream;
  if (u->params_on_host) return fsdp_event_synchronize(u->step_done); /* the shard stays on the host: unshard copies it up */
  if (u->xfer_stream) {
    FSDP_CHECK(fsdp_event_synchronize(u->step_done));
    FSDP_CHECK(fsdp_memcpy(u->param_shard, u->host_stage, (size_t)u->shard_numel * u->compute_size, u->xfer_stream));
    FSDP_CHECK(fsdp_event_record(u->shard_uploaded, u->xfer_stream));
    FSDP_CHECK(fsdp_stream_wait_event(cs, u->shard_uploaded));
  } else {
    FSDP_CHECK(fsdp_stream_wait_event(cs, u->step_done));
  }
  if (u->cfg.zero <= 2) { /* resident full params: gather the new values */
    FSDP_CHECK(fsdp_comm_all_gather(u->shard_comm, u->params_full, u->param_shard, (size_t)u->shard_numel, u->cfg.compute_dtype));
    FSDP_CHECK(fsdp_event_record(u->gathered, cs));
  }
  return FSDP_OK;
}
