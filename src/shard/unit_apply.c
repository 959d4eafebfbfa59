/* unit_apply.c: an optimizer step applied to a unit: the pieces this rank
 * owns updated (unit_update.c, or a job on the host stream when offloaded),
 * the new values published to the compute params, the grads zeroed; and the
 * step deferred to the unit's next use where the unit overlaps it
 * (fsdp_unit_config.overlap_step): every call that reads the unit's params,
 * grads or optimizer state settles it first (fsdp_unit_settle), so on a GPU
 * unit k's update runs on the shard stream while the next forward computes
 * unit k-1, instead of every update before the forward's first gather. */
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "../fsdp_shard.h"
#include "unit_impl.h"

int fsdp_unit_zero_main_grads(fsdp_unit *u) {
  size_t bytes = (size_t)u->opt_numel * fsdp_dtype_size(u->main_grad_dtype);
  if (u->device == FSDP_CUDA && !u->offload) { /* behind the optimizer's kernels on the shard stream */
    FSDP_CHECK(fsdp_memset(u->main_grads, 0, bytes, u->shard_comm->stream));
    return u->grads_zeroed ? fsdp_event_record(u->grads_zeroed, u->shard_comm->stream) : FSDP_OK;
  }
  memset(u->main_grads, 0, bytes);
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

/* Update what this rank owns (zero 0: everything), write the new values
 * back to the compute params, and zero the grads. */
static int apply_step(fsdp_unit *u, const fsdp_step_args *a) {
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
  return fsdp_unit_zero_main_grads(u);
}

int fsdp_unit_apply_step(fsdp_unit *u, const fsdp_step_args *a) {
  if (!u->cfg.overlap_step) return apply_step(u, a);
  u->deferred = *a; /* (its AdamW config copied: the caller's goes out of scope) */
  if (a->adamw) {
    u->deferred_adamw = *a->adamw;
    u->deferred.adamw = &u->deferred_adamw;
  }
  u->step_deferred = 1;
  return FSDP_OK;
}

int fsdp_unit_settle(fsdp_unit *u) {
  if (u->step_deferred) {
    u->step_deferred = 0; /* (before: the step's own calls settle too) */
    FSDP_CHECK(apply_step(u, &u->deferred));
  }
  return fsdp_offload_settle(u);
}
