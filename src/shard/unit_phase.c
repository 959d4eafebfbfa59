/* unit_phase.c: a unit's whole state off the device and back (phase
 * offload, fsdp.engine's offload / onload: post-training frees the device
 * while a rollout engine generates, then trains again).
 *
 * offload copies each row the plan holds on the device (FSDP_HELD_DEVICE:
 * params, grads, optimizer state) into host memory of its own (pinned on a
 * GPU, so the copies run at the link's speed), frees the device memory and
 * sets the unit's pointers to NULL (aliases follow their rows); rows the
 * plan keeps on the host already (the offloaded optimizer's) stay. The
 * comms' scratch shares are given back, so the scratch goes with the last
 * unit. onload allocates each row again, copies it back and frees the host
 * copy: the same bytes, so training goes on bit for bit. The host copies
 * are kept after an onload for the next offload (an RL loop moves the state
 * every step; allocating and first touching host memory cost more than the
 * copies: bench/RESULTS.md): after the first offload the unit holds its
 * state's size in host memory too. Calls that need a
 * row that is off the device are refused (unit_lifecycle.c,
 * fsdp_unit_placed_check). */
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "unit_impl.h"

int fsdp_unit_placement_get(const fsdp_unit *u) { return u ? u->placed : -1; }

/* row i is the unit's own device memory, the kind that moves */
static int moves(const fsdp_unit *u, int i) { return u->plan.rows[i].held == FSDP_HELD_DEVICE; }

/* the rows a forward reads: the compute params, and what they alias */
static int param_row(const fsdp_unit *u, int i) {
  for (int r = FSDP_UBUF_PARAM_SHARD; r <= FSDP_UBUF_PARAMS_FULL; r++) {
    if (i == r) return 1;
    if (u->plan.rows[r].held == FSDP_HELD_ALIAS && u->plan.rows[r].alias_of == i) return 1;
  }
  return 0;
}

/* aliases take their rows' memory (NULL while that is off the device) */
static void resolve_aliases(const fsdp_unit *u, void *rows[FSDP_UBUF_COUNT]) {
  for (int i = 0; i < FSDP_UBUF_COUNT; i++)
    if (u->plan.rows[i].held == FSDP_HELD_ALIAS) rows[i] = rows[u->plan.rows[i].alias_of];
}

static int settle_streams(fsdp_unit *u) {
  FSDP_CHECK(fsdp_stream_synchronize(u->shard_comm->stream));
  if (u->reduce_comm != u->shard_comm) FSDP_CHECK(fsdp_stream_synchronize(u->reduce_comm->stream));
  if (u->outer_comm) FSDP_CHECK(fsdp_stream_synchronize(u->outer_comm->stream));
  return FSDP_OK;
}

int fsdp_unit_offload(fsdp_unit *u) {
  if (!u) return fsdp_fail(FSDP_EINVAL, "unit_offload: NULL unit");
  if (u->placed == FSDP_PLACED_HOST) return FSDP_OK;
  if (u->cfg.comm_register)
    return fsdp_fail(FSDP_EUNSUPPORTED, "unit '%s': offload: its buffers are registered with the comm "
                     "(fsdp.comm_register): they cannot move; use comm_register = 'none'", u->name);
  if (u->placed == FSDP_PLACED_DEVICE) FSDP_CHECK(fsdp_unit_settle(u)); /* a deferred or host step, applied now */
  if (u->params_state == FSDP_PARAMS_GATHERING || u->params_state == FSDP_PARAMS_GATHERED)
    return fsdp_fail(FSDP_ESTATE, "unit '%s': offload while its params are %s: reshard() first", u->name,
                     fsdp_unit_params_state_name(u->params_state));
  if (u->grads_state != FSDP_GRADS_CLEAN)
    return fsdp_fail(FSDP_ESTATE, "unit '%s': offload while its grads are %s: step() or zero_grad() first", u->name,
                     fsdp_unit_grads_state_name(u->grads_state));
  FSDP_CHECK(settle_streams(u));
  void *rows[FSDP_UBUF_COUNT];
  fsdp_unit_rows_get(u, rows);
  /* copies first, frees after all of them: a failed copy leaves the unit as it was */
  void *host[FSDP_UBUF_COUNT] = {0};
  int rc = FSDP_OK;
  for (int i = 0; i < FSDP_UBUF_COUNT && rc == FSDP_OK; i++) {
    if (!moves(u, i) || !rows[i]) continue; /* (NULL: off the device already, params-only onload) */
    size_t bytes = (size_t)u->plan.rows[i].bytes;
    host[i] = u->kept[i]; /* the host copy an earlier onload kept: no allocation, no first touch */
    if (!host[i]) rc = fsdp_unit_host_alloc(u, bytes, &host[i]);
    if (rc == FSDP_OK && bytes) rc = fsdp_memcpy(host[i], rows[i], bytes, NULL);
  }
  if (rc < 0) {
    for (int i = 0; i < FSDP_UBUF_COUNT; i++)
      if (host[i] != u->kept[i]) fsdp_unit_host_free(u, host[i]);
    return fsdp_fail_context(rc, "unit '%s': offload", u->name);
  }
  for (int i = 0; i < FSDP_UBUF_COUNT; i++) {
    if (!host[i]) continue;
    fsdp_free(u->device, rows[i]);
    rows[i] = NULL;
    u->parked[i] = host[i];
    u->kept[i] = NULL;
  }
  resolve_aliases(u, rows);
  fsdp_unit_rows_set(u, rows);
  /* the scratch shares held where it was: on the device both, for forwards the gather stage */
  if (u->holds_reduce_scratch && u->placed == FSDP_PLACED_DEVICE) fsdp_comm_scratch_release(u->reduce_comm);
  if (u->holds_gather_stage) fsdp_comm_scratch_release(u->shard_comm);
  u->placed = FSDP_PLACED_HOST;
  return FSDP_OK;
}

int fsdp_unit_onload(fsdp_unit *u, int params_only) {
  if (!u) return fsdp_fail(FSDP_EINVAL, "unit_onload: NULL unit");
  const int want = params_only ? FSDP_PLACED_PARAMS : FSDP_PLACED_DEVICE;
  if (u->placed == FSDP_PLACED_DEVICE || u->placed == want) return FSDP_OK;
  void *rows[FSDP_UBUF_COUNT];
  fsdp_unit_rows_get(u, rows);
  /* allocations first, then the copies, then the host copies freed: a
   * failure leaves the unit offloaded as it was */
  void *dev[FSDP_UBUF_COUNT] = {0};
  int rc = FSDP_OK;
  for (int i = 0; i < FSDP_UBUF_COUNT && rc == FSDP_OK; i++) {
    if (!u->parked[i] || (params_only && !param_row(u, i))) continue;
    size_t bytes = (size_t)u->plan.rows[i].bytes;
    rc = fsdp_alloc(u->device, bytes ? bytes : 1, &dev[i]); /* (not zeroed: the copy writes every byte) */
    if (rc == FSDP_OK && bytes) rc = fsdp_memcpy(dev[i], u->parked[i], bytes, NULL);
  }
  /* the comms' scratch: the gather stage for any forward, the reduce staging for training */
  int gather = 0, reduce = 0;
  if (rc == FSDP_OK && u->holds_gather_stage && u->placed == FSDP_PLACED_HOST) {
    rc = fsdp_comm_scratch_reserve(u->shard_comm, (size_t)u->plan.gather_stage);
    gather = rc == FSDP_OK;
  }
  if (rc == FSDP_OK && u->holds_reduce_scratch && !params_only) {
    rc = fsdp_comm_scratch_reserve(u->reduce_comm, (size_t)u->plan.reduce_scratch);
    reduce = rc == FSDP_OK;
  }
  if (rc < 0) {
    if (gather) fsdp_comm_scratch_release(u->shard_comm);
    if (reduce) fsdp_comm_scratch_release(u->reduce_comm);
    for (int i = 0; i < FSDP_UBUF_COUNT; i++) fsdp_free(u->device, dev[i]);
    return fsdp_fail_context(rc, "unit '%s': onload", u->name);
  }
  for (int i = 0; i < FSDP_UBUF_COUNT; i++) {
    if (!dev[i]) continue;
    rows[i] = dev[i];
    u->kept[i] = u->parked[i]; /* kept for the next offload (a loop moves the state every step) */
    u->parked[i] = NULL;
  }
  resolve_aliases(u, rows);
  fsdp_unit_rows_set(u, rows);
  u->placed = want;
  return FSDP_OK;
}
