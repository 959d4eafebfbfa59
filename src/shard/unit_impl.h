/* unit_impl.h: an FSDP unit's fields, and how its files call one another.
 *
 * One unit, eight files, each one idea, calls going down this list only:
 *   unit_phase.c   offload / onload of the whole state     -> apply, unit
 *   unit_state.c   training state for checkpoints         -> apply, comm, unit
 *   unit_step.c    grad norm, zero_grad, the step's entry  -> apply, comm, unit
 *   unit_comm.c    gather / reduce on the comm streams, views -> apply, offload, update, unit
 *   unit_apply.c   a step applied (now or at the next use), publish -> offload, update, unit
 *   offload.c      the optimizer step as a host job       -> update
 *   unit_update.c  the per-piece updates, casts, norm sum (no other unit file)
 *   unit.c         create / destroy from the plan, owned pieces, split params
 *   unit_plan.c    the buffer plan (pure; public API)
 *   unit_lifecycle.c  the named states and their checked transitions (a leaf)
 * (unit.c calls unit_update.c's cast and offload.c's attach while it
 * builds a unit.) */
#ifndef FSDP_SHARD_UNIT_IMPL_H
#define FSDP_SHARD_UNIT_IMPL_H

#include "../device/device_impl.h"
#include "../dist/comm_impl.h"
#include "../fsdp_shard.h"
#include "pool.h"

/* How fsdp_unit_reduce reduces a unit's grads, chosen once from its plan
 * when it is made (unit.c, build), not again from flags at each call:
 *   COMPACT      one micro-batch, bf16 grads that stay bf16 (plan.grads_compact)
 *   ALL_REDUCE   zero 0: the full grads all-reduced (into the fp32 main grads)
 *   SCATTER_FULL zero 1: the full grads reduce-scattered once, on the last micro-batch
 *   SCATTER_EACH zero 2-3: each micro-batch's pooled grads reduce-scattered
 * With plan.sums_fp32 (zero 0-1, bf16, several micro-batches) the
 * micro-batches first add up in fp32 (reduce_sums), the last reducing the sum. */
/* The events of unit_lifecycle.c's two state machines: the first three
 * move the params (fsdp_unit_params_state), the rest the grads
 * (fsdp_unit_grads_state). */
typedef enum {
  UNIT_EV_UNSHARD, UNIT_EV_WAIT, UNIT_EV_RESHARD,
  UNIT_EV_GRADS, UNIT_EV_REDUCE_PART, UNIT_EV_REDUCE_LAST, UNIT_EV_STEP, UNIT_EV_ZERO_GRAD
} unit_event;

typedef enum { UNIT_REDUCE_COMPACT, UNIT_REDUCE_ALL_REDUCE, UNIT_REDUCE_SCATTER_FULL, UNIT_REDUCE_SCATTER_EACH } unit_reduce_path;

/* An optimizer update of elements [off, off + len) of the optimizer's
 * arrays, which belong to parameter `param`. With stage set the new values
 * also go to stage + off in the compute dtype, in the same pass (the
 * compute params in place, the host staging when offloaded). */
typedef struct fsdp_step_args {
  int64_t step;
  float grad_scale;
  const fsdp_adamw_config *adamw; /* NULL: SGD */
  float lr, momentum, weight_decay; /* SGD */
  void *stage;
} fsdp_step_args;

struct fsdp_unit {
  char name[128];
  fsdp_unit_config cfg;
  fsdp_unit_plan plan;    /* what it holds (unit_plan.c) */
  fsdp_layout *layout;
  int nparams;
  int64_t *numels;
  uint8_t *no_decay;
  int device;             /* FSDP_CPU or FSDP_CUDA: the shard group's */
  int shard_ranks, shard_rank;
  fsdp_comm *shard_comm;  /* gathers, and the optimizer's kernels on GPUs */
  fsdp_comm *reduce_comm; /* reductions over the shard group: the same members on another
                             channel (or shard_comm); its scratch is the reduce staging */
  fsdp_comm *outer_comm;  /* HSDP replicas, or NULL */
  fsdp_pool *param_pool, *grad_pool;
  int64_t shard_numel, total_numel, opt_numel, opt_offset; /* from the plan */
  size_t compute_size;    /* bytes of a compute-dtype element */
  int hfsdp;              /* the optimizer's range is 1/R of the shard */
  int offload;            /* the optimizer's buffers in host memory, the step on the host */
  int params_on_host;     /* GPU, FSDP_OFFLOAD_PARAMS: no device param shard; host_stage is
                             the shard, copied up into the shard comm's scratch to gather */
  int grads_on_host;      /* FSDP_OFFLOAD_GRADS: grad_accum is main_grads (host); reductions
                             land there through the reduce scratch; the step zeroes it */
  int compute_is_main;    /* fp32 in place: param_shard (zero >= 1) or params_full (zero 0)
                             is main_params */
  int main_split;         /* bf16 in place: the fp32 main params are the compute params
                             (fsdp_unit_inplace_stage) as high halves and main_low as low
                             ones (base/bf16_split.h) */
  int grads_compact;      /* main_grads are bf16: one micro-batch, reduced into bf16 or not
                             at all (fsdp_unit_plan.grads_compact); no grad_accum */
  int main_grad_dtype;    /* FSDP_FP32, or FSDP_BF16 where compact */
  int sums_fp32;          /* zero 0-1: micro-batches add up in fp32 (fsdp_unit_plan.sums_fp32) */
  int reduce_path;        /* unit_reduce_path: how fsdp_unit_reduce reduces, chosen once (build) */
  int sum_pending;        /* sums_fp32: a micro-batch before the last was added in */
  int step_deferred;      /* overlap_step: a step waits for the unit's next use (unit_apply.c) */
  fsdp_step_args deferred;
  fsdp_adamw_config deferred_adamw;
  int params_state;       /* fsdp_unit_params_state (unit_lifecycle.c) */
  int grads_state;        /* fsdp_unit_grads_state */

  /* resident buffers: the plan's rows */
  float *main_params, *opt1, *opt2; /* main_params NULL where split */
  void *main_grads;       /* the grads the optimizer reads, main_grad_dtype */
  uint16_t *main_low;     /* split: the main params' low halves (the main_params row) */
  float *grad_accum;      /* where fp32 reductions accumulate: main_grads, or its own shard */
  void *param_shard, *params_full, *grads_full;
  float *grads_sum;       /* zero 1, sums_fp32: the full fp32 sum of the micro-batches */
  void *host_stage;
  int holds_reduce_scratch, holds_gather_stage;
  fsdp_comm_reg *registrations[3];
  fsdp_comm *registered_with[3];
  int nregistrations;

  /* zero 3: the full params while gathered (NULL while sharded): a buffer
   * from the param pool, or the shard itself when one rank holds the unit */
  void *gathered_params;
  /* full buffers borrowed from the pools */
  int param_slot, grad_slot; /* -1: none */
  void *pooled_grads;

  /* ordering */
  fsdp_event *gathered;     /* on the shard stream: the full params are there */
  fsdp_event *handoff;      /* compute (or the reduce stream) to the next stream */
  fsdp_event *grads_zeroed; /* GPU, separate reduce comm or compact grads: the step's
                               zeroing of main_grads (on the shard stream) */
  fsdp_event *grads_free;   /* sums_fp32: the full grads added in and zeroed (reduce stream) */
  fsdp_unit_times times;    /* written on the comm stream, read after it is waited for */
  fsdp_event *probe[2][2];  /* fsdp_unit_probe: [gather / reduce][begin / end], the caller's */
  int probe_used[2];        /* the probe set last was recorded */

  /* the grad norm, queued behind the last reduction */
  void *norm_device;        /* GPU: double sum, int64 non-finite count */
  int norm_pending;
  double norm_sum;          /* CPU ranks: the result, written on the comm stream */
  int64_t norm_nonfinite;
  int norm_status;

  /* offload (offload.c): the step runs on the shared host stream while the
   * next forward starts; fsdp_offload_settle before the params are used */
  fsdp_stream *host_stream, *xfer_stream; /* the shared host stream, (GPU) the transfer stream */
  fsdp_event *step_done;                  /* host stream: the new values are in the staging */
  fsdp_event *grads_reduced, *grads_moved, *shard_uploaded; /* GPU */
  int step_pending;       /* a step is queued on the host stream, not yet settled */
  int grads_stale;        /* main_grads hold grads a step already used (no reduce since) */

  /* phase offload (unit_phase.c): where its device rows are (fsdp_unit_placement),
   * and the host copies of those moved off the device */
  int placed;
  void *parked[FSDP_UBUF_COUNT]; /* a row's host copy while it is off the device */
  void *kept[FSDP_UBUF_COUNT];   /* and after an onload, kept for the next offload */
};

/* The reduce comm's shared fp32 scratch (at least shard_numel floats): the
 * reduce-scatter's staging on the reduce stream. Between steps, when no
 * reduction runs, creation and HFSDP's publish also stage through it. */
static inline float *fsdp_unit_reduce_scratch(const fsdp_unit *u) { return (float *)u->reduce_comm->scratch; }

/* ---- unit_lifecycle.c ---- */
/* FSDP_OK when event e is allowed in u's state, else FSDP_ESTATE with a
 * message naming the unit, its state and the call that should come first */
int fsdp_unit_check(const fsdp_unit *u, unit_event e);
/* the state e leads to, once the operation it names has succeeded */
void fsdp_unit_enter(fsdp_unit *u, unit_event e);

/* FSDP_OK when the unit's placement allows the call (what: its name),
 * else FSDP_ESTATE naming the unit: need_all 1 for everything on the
 * device (grads, reductions, steps, state), 0 for the params alone */
int fsdp_unit_placed_check(const fsdp_unit *u, int need_all, const char *what);


/* ---- unit.c ---- */
/* the unit's row pointers, by fsdp_unit_buffer: read, and set from an array */
void fsdp_unit_rows_get(const fsdp_unit *u, void *rows[FSDP_UBUF_COUNT]);
void fsdp_unit_rows_set(fsdp_unit *u, void *const rows[FSDP_UBUF_COUNT]);
/* device memory of bytes, zeroed */
int fsdp_unit_alloc_zeroed(int device, size_t bytes, void **out);
/* host memory for a row's copy (pinned on a GPU), and its release; the
 * unit's host copies freed (destroy) */
int fsdp_unit_host_alloc(const fsdp_unit *u, size_t bytes, void **out);
void fsdp_unit_host_free(const fsdp_unit *u, void *p);
void fsdp_unit_phase_free(fsdp_unit *u);
/* the element ranges this rank's optimizer holds (to_save 0), or saves: see
 * fsdp_unit_state_pieces; a malloc'ed array in *out, its length returned */
int fsdp_unit_owned_pieces(const fsdp_unit *u, fsdp_layout_piece **out);
/* Where the in-place step writes the new compute params as it updates
 * (zero 0: the full copy; else the compute shard; the high halves of split
 * main params); NULL where the publish casts instead (HFSDP gathers the
 * replicas' ranges) or nothing is to be written (fp32 in place). */
void *fsdp_unit_inplace_stage(const fsdp_unit *u);
/* Split main params, elements [off, off + n) of the optimizer's range, to
 * or from host memory: joined into dst, or (dst NULL) split from src into
 * the compute params and main_low. Meta init and unit_state.c. */
int fsdp_unit_split_params(fsdp_unit *u, int64_t off, int64_t n, float *dst, const float *src);

/* ---- unit_update.c: the optimizer's work on a unit's buffers ---- */
/* update pieces ps[0..k): the in-place step's loop and the offloaded one's */
int fsdp_unit_update_pieces(fsdp_unit *u, const fsdp_step_args *a, const fsdp_layout_piece *ps, int k);
/* dst (compute dtype) = src (fp32): at once on CPU, on stream s on a GPU */
int fsdp_unit_cast_out(void *dst, int dtype, const float *src, int64_t n, fsdp_stream *s);
/* GPU: queue the sum of squares of g[0..n) into norm_device on s */
int fsdp_unit_norm_on_device(fsdp_unit *u, const void *g, int dtype, int64_t n, fsdp_stream *s);

/* ---- offload.c: the offloaded step, off the caller's thread ---- */
int fsdp_offload_attach(fsdp_unit *u);
void fsdp_offload_detach(fsdp_unit *u);
/* GPU: behind the reductions on s, the grad norm's sum on the device, then
 * the grads copied down on the transfer stream */
int fsdp_offload_grads_down(fsdp_unit *u, fsdp_stream *s);
/* GPU: the comm streams wait until the last copy-down is done with the
 * device grads (the next step accumulates into them) */
int fsdp_offload_before_reduce(fsdp_unit *u);
/* Queue the update of pieces ps[0..k) (takes ps) and return at once. */
int fsdp_offload_step(fsdp_unit *u, const fsdp_step_args *a, fsdp_layout_piece *ps, int k);
/* Before anything uses the params or the optimizer's buffers again: order
 * the upload (GPU) and the all-gather (zero 1/2) after the queued step.
 * CPU ranks: event-ordered, no wait; GPU: waits for the host step. */
int fsdp_offload_settle(fsdp_unit *u);
/* 1 when a queued step has not finished yet (prefetch skips the unit) */
int fsdp_offload_busy(fsdp_unit *u);
/* GPU: wait for the copy-down of the grads */
int fsdp_offload_synchronize(fsdp_unit *u);

/* ---- unit_apply.c ---- */
/* the compute-dtype params recomputed from the fp32 main params */
int fsdp_unit_publish_params(fsdp_unit *u);
/* zero the grads the optimizer reads (GPU: behind the step on the shard stream) */
int fsdp_unit_zero_main_grads(fsdp_unit *u);
/* apply step a to what this rank owns: now, or (overlap_step) at the unit's next use */
int fsdp_unit_apply_step(fsdp_unit *u, const fsdp_step_args *a);
/* before anything reads the unit's params, grads or optimizer state: the
 * deferred step applied, and an offloaded step ordered (fsdp_offload_settle) */
int fsdp_unit_settle(fsdp_unit *u);

#endif
