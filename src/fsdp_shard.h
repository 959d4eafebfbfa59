/* fsdp_shard.h: the shard layer's API (src/shard/): how parameters pack
 * into a unit's flat buffer and who owns which elements (layout), meta
 * init, the optimizers on flat fp32 shards, the full-unit buffer pools, and
 * FSDP units: their buffer plan, their gather / reduce / step state
 * machine, and their training state for checkpoints. Part of the public
 * API: included by fsdp.h, read by ffi.lua, FFI-clean like it. */
#ifndef FSDP_SHARD_API_H
#define FSDP_SHARD_API_H

#include "fsdp_dist.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How fully_shard and the planner lay units out: each parameter starts at
 * a multiple of FSDP_PARAM_ALIGN elements, each shard is a multiple of
 * FSDP_SHARD_ALIGN elements (times the outer group's size with HFSDP). */
enum { FSDP_PARAM_ALIGN = 16, FSDP_SHARD_ALIGN = 32 };

/* ---- layout: parameters in a unit's flat buffer, and their owners ------ */
typedef struct fsdp_layout fsdp_layout;
typedef struct fsdp_layout_piece {
  int32_t param;        /* index in the unit */
  int32_t rank;         /* owner, in the shard group */
  int64_t begin, end;   /* element range of the parameter */
  int64_t shard_offset; /* where begin sits in the owner's shard */
} fsdp_layout_piece;

/* Parameters packed in order, each starting at a multiple of param_align
 * elements; padded to group_size equal shards, each a multiple of
 * shard_align elements (see src/shard/layout.c). */
int fsdp_layout_create(int nparams, const int64_t *numels, int group_size, int64_t param_align,
                       int64_t shard_align, fsdp_layout **out);
int fsdp_layout_destroy(fsdp_layout *l);
int64_t fsdp_layout_numel_used(const fsdp_layout *l);   /* sum of parameter sizes */
int64_t fsdp_layout_numel_total(const fsdp_layout *l);  /* with padding: group_size * shard */
int64_t fsdp_layout_shard_numel(const fsdp_layout *l);
int fsdp_layout_group_size(const fsdp_layout *l);      /* the shards' count */
int64_t fsdp_layout_param_offset(const fsdp_layout *l, int param);
/* Pieces rank owns, in parameter order; returns how many (may exceed cap). */
int fsdp_layout_rank_pieces(const fsdp_layout *l, int rank, fsdp_layout_piece *out, int cap);
int fsdp_layout_owner(const fsdp_layout *l, int param, int64_t index, fsdp_layout_piece *out);

/* Meta init: fill rank's shard (shard_numel elements of dtype) with the
 * values its pieces have in the full model: element i of a parameter named
 * N is draw(seed, fsdp_rng_stream_id(N), i) under that parameter's rule.
 * Padding is zero. Independent of world size and grouping by construction. */
typedef enum { FSDP_INIT_NORMAL = 0, FSDP_INIT_UNIFORM = 1, FSDP_INIT_CONSTANT = 2 } fsdp_init_kind;
typedef struct fsdp_init_rule {
  int32_t kind;
  int32_t pad;
  double a, b; /* normal: mean, std; uniform: low, high; constant: value */
  /* A tensor-parallel slice of a 2-D parameter: local element i is element
   * (i / cols + row0, i % cols + col0) of the full [rows, gcols] one, so a
   * slice holds the values the full parameter has there (cols = 0: the
   * parameter is whole) */
  int64_t cols, gcols, row0, col0;
} fsdp_init_rule;
int fsdp_layout_init_shard(const fsdp_layout *l, int rank, const char *const *param_names,
                           const fsdp_init_rule *rules, uint64_t seed, void *shard, fsdp_dtype dtype);

/* ---- optimizers on flat fp32 shards (src/shard/adamw.c); their config,
 * fsdp_adamw_config, is in fsdp_base.h --------------------------------- */
/* One AdamW step over n elements; step counts from 1. param_bf16 (may be
 * NULL) receives the new values rounded to bf16 (ties away from zero) in the
 * same pass. Split params (param_low not NULL, param NULL): each fp32 param
 * is param_bf16[i] and param_low[i] (base/bf16_split.h), both read and
 * written. The gradient (grad_dtype fp32, or bf16 where a unit keeps its
 * grads so) is multiplied by grad_scale first (averaging, clipping). */
int fsdp_adamw_step(float *param, uint16_t *param_bf16, uint16_t *param_low, const void *grad, int grad_dtype, float *m,
                    float *v, int64_t n, int64_t step, const fsdp_adamw_config *cfg, float grad_scale);
/* SGD with momentum mu (0: plain SGD), coupled weight decay; the params as
 * for fsdp_adamw_step. */
int fsdp_sgd_step(float *param, uint16_t *param_bf16, uint16_t *param_low, const void *grad, int grad_dtype,
                  float *momentum, int64_t n, int64_t step, float lr, float mu, float weight_decay, float grad_scale);
/* Sum of squares (float64) of the finite elements of x (fp32 or bf16), and
 * how many were not. */
int fsdp_sum_squares(const void *x, int dtype, int64_t n, double *sum, int64_t *nonfinite);

/* ---- FSDP units: flat param/grad buffers and their state machine ------ */
typedef struct fsdp_pool fsdp_pool;
typedef struct fsdp_unit fsdp_unit;

/* Full-unit buffers (zero 3's gathered params, zero 2/3's full grads):
 * nslots buffers of slot_bytes[i] bytes each (the bound: at most nslots
 * live at once; fully_shard sizes them after its largest units). A request
 * takes the smallest free slot that fits. */
int fsdp_pool_create(int device, int nslots, const int64_t *slot_bytes, fsdp_pool **out);
/* That choice, alone: the slot a request of `bytes` takes (-1: none fits),
 * for the planner's replay of the schedule. */
int fsdp_pool_pick(int nslots, const int64_t *slot_bytes, const uint8_t *taken, int64_t bytes);
int fsdp_pool_destroy(fsdp_pool *p);
int fsdp_pool_live(const fsdp_pool *p);
int fsdp_pool_peak(const fsdp_pool *p);
/* Reallocate the pool's buffers with fsdp_comm_mem_alloc and register them
 * with c in `mode` (before any is acquired; collective for windows). */
int fsdp_pool_register(fsdp_pool *p, fsdp_comm *c, int mode);
/* Phase offload (fsdp.engine): park frees every buffer (none may be
 * taken; each waited for), unpark allocates them again; acquiring from a
 * parked pool is refused. Not for registered pools. */
int fsdp_pool_park(fsdp_pool *p);
int fsdp_pool_unpark(fsdp_pool *p);

typedef enum { FSDP_OFFLOAD_OPTIMIZER = 1, FSDP_OFFLOAD_PARAMS = 2, FSDP_OFFLOAD_GRADS = 4 } fsdp_offload_bits;
typedef struct fsdp_unit_config {
  int32_t zero;          /* 0..3, see docs/ARCHITECTURE.md */
  int32_t compute_dtype; /* fp32 or bf16: params as used by compute, and grads */
  int32_t reduce_dtype;  /* fp32 (accumulate in fp32) or the compute dtype */
  int32_t grad_op;       /* FSDP_AVG or FSDP_SUM over the data-parallel ranks */
  int64_t param_align, shard_align; /* elements; see fsdp_layout_create */
  int32_t hfsdp;         /* 1: also shard the fp32 main params and optimizer state over
                            the outer group (HSDP + optimizer sharding); zero >= 1 */
  int32_t offload;       /* fsdp_offload_bits, 0: none. Any bit: the fp32 main params,
                            optimizer state and the grads it reads live in (pinned) host
                            memory and the step runs on CPU threads; zero >= 1, not with
                            hfsdp. PARAMS: the compute-dtype param shard too (zero 3; on GPUs
                            copied up before each all-gather). GRADS: no fp32 grad shard on
                            the device either; reductions land in the host's (no HSDP) */
  int32_t comm_register; /* fsdp_comm_reg_mode for the buffers the shard group's collectives
                            read and write (compute shard, full params and grads); 0: none */
  int32_t micro_batches; /* backward passes per optimizer step when fixed, 0: any. 1 lets a
                            bf16 unit keep the grads the optimizer reads in bf16 where no sum
                            is taken in fp32 (fsdp_unit_plan.grads_compact); reduce() then
                            refuses a micro-batch that is not the last */
  int32_t overlap_step;  /* 1: fsdp_unit_step only records the step; it is applied when the
                            unit is next used (its unshard, wait, grads, a view, a read of
                            its state, synchronize), so that on a GPU each unit's update runs
                            on the shard stream beside the next forward's compute instead of
                            all of them before its first gather. The same arithmetic in the
                            same order: results bit for bit those of 0. Not with offload
                            (which overlaps on the host already) or hfsdp */
} fsdp_unit_config;

/* ---- a unit's buffer plan (src/shard/unit_plan.c) ----
 * Which buffers a unit holds for its whole life, where and how big, from
 * its config and layout alone: fsdp_unit_create allocates exactly these,
 * fsdp_unit_memory_info reports them, and the planner (`fsdp plan`) calls
 * the same function for units that do not exist. */
typedef enum {
  FSDP_UBUF_MAIN_PARAMS = 0, /* fp32 main params: the optimizer's range of the shard */
  FSDP_UBUF_OPT1 = 1,        /* AdamW exp_avg, SGD momentum */
  FSDP_UBUF_OPT2 = 2,        /* AdamW exp_avg_sq */
  FSDP_UBUF_MAIN_GRADS = 3,  /* the grads the optimizer reads: fp32 (bf16 where grads_compact) */
  FSDP_UBUF_GRAD_ACCUM = 4,  /* fp32 grad shard the reductions accumulate into on the device,
                                where that is not MAIN_GRADS (HFSDP; offloaded optimizer) */
  FSDP_UBUF_PARAM_SHARD = 5, /* compute-dtype param shard (zero 1-3) */
  FSDP_UBUF_PARAMS_FULL = 6, /* compute-dtype full params, resident (zero 0-2) */
  FSDP_UBUF_GRADS_FULL = 7,  /* compute-dtype full grads, resident (zero 0-1) */
  FSDP_UBUF_HOST_STAGE = 8,  /* offload on a GPU: the new compute shard, cast on the host */
  FSDP_UBUF_GRADS_SUM = 9,   /* zero 1, bf16 compute, micro-batches: the fp32 full grads they
                                add up in before the one reduce-scatter (zero 0 sums in
                                main_grads, full already) */
  FSDP_UBUF_COUNT = 10
} fsdp_unit_buffer;
typedef enum {
  FSDP_HELD_NOT = 0,    /* the unit has no such buffer */
  FSDP_HELD_DEVICE = 1, /* its own, on the unit's device */
  FSDP_HELD_HOST = 2,   /* its own, in host memory (pinned on a GPU) */
  FSDP_HELD_ALIAS = 3   /* the same memory as row alias_of (no bytes of its own) */
} fsdp_unit_held;
typedef struct fsdp_unit_buffer_row {
  int32_t held;      /* fsdp_unit_held */
  int32_t alias_of;  /* FSDP_HELD_ALIAS: the row whose memory it is */
  int32_t comm;      /* 1: the shard group's collectives read or write it (registered
                        with the comm when the config asks) */
  int32_t pad;
  int64_t bytes;     /* 0 unless held DEVICE or HOST */
} fsdp_unit_buffer_row;
typedef struct fsdp_unit_plan {
  int64_t shard_numel, total_numel; /* the layout's shard, and shard x ranks */
  int64_t opt_numel, opt_offset;    /* the optimizer's range: [offset, offset + numel) of the
                                       shard (zero 0: all of the full params, offset 0) */
  int32_t compute_is_main;          /* fp32 compute in place: the compute params are the
                                       main params (no copy) */
  int32_t main_split;               /* bf16 compute in place: the fp32 main params are the
                                       compute params (their high halves) and the main_params
                                       row's 16 low bits each (base/bf16_split.h) */
  int32_t grads_compact;            /* the grads the optimizer reads are bf16 (the main_grads
                                       row is 2 bytes an element, or the full grads): one
                                       micro-batch, and the reduction's output is bf16 values
                                       (one shard rank, or reduce_dtype bf16), so fp32 would
                                       hold the same numbers in twice the bytes */
  /* shared and transient memory, not in rows: */
  int64_t reduce_scratch;  /* fp32 staging for reduce-scatters, shared by the units of a
                              shard group in the reduce comm (its largest unit's) */
  int64_t gather_stage;    /* params on the host: compute-dtype staging in the shard comm's
                              scratch, shared likewise */
  int64_t pool_params;     /* a full compute-dtype buffer from the param pool while gathered
                              (zero 3), 0: none */
  int64_t pool_grads;      /* the same from the grad pool during backward (zero 2-3) */
  int32_t sums_fp32;                /* zero 0-1, bf16 compute, fp32 reductions and possibly
                                       several micro-batches: each micro-batch's full grads
                                       are added into fp32 (main_grads at zero 0, the
                                       grads_sum row at zero 1) instead of adding up in the
                                       bf16 full grads */
  fsdp_unit_buffer_row rows[10]; /* by fsdp_unit_buffer */
  int64_t norm_sums;       /* on a GPU: the grad norm's device sums (a double and a count), 0
                              on the CPU (the host adds them up) */
  int64_t cast_stage;      /* on a GPU, bf16 grads reduce-scattered into fp32: NCCL's fp32
                              block for the cast, chunk by chunk (transient, the largest
                              unit's), 0: none */
} fsdp_unit_plan;
/* The plan of a unit with this config and layout on `device`, sharded over
 * shard_ranks (the layout's group size) and, HSDP, replicated over
 * outer_ranks (1: none; outer_rank: this rank's place there, which HFSDP's
 * optimizer range depends on). */
int fsdp_unit_plan_make(const fsdp_unit_config *cfg, const fsdp_layout *layout, int device, int outer_ranks,
                        int outer_rank, fsdp_unit_plan *out);
/* The config's rules (zero, dtypes, offload, hfsdp, registration), which
 * fsdp_unit_plan_make and fsdp_unit_create both run: a plan is never shown
 * for a unit creation would refuse. outer_ranks: the HSDP replicas, 1: none. */
int fsdp_unit_config_check(const fsdp_unit_config *cfg, int outer_ranks);
/* "main_params", "opt1", ... for rows; NULL for another index */
const char *fsdp_unit_buffer_name(int buffer);

/* What fsdp_unit_create needs, by name. */
typedef struct fsdp_unit_spec {
  const char *name;
  int32_t nparams;
  const char *const *param_names;
  const int64_t *numels;
  const fsdp_init_rule *rules;  /* meta init of each parameter */
  const uint8_t *no_decay;      /* per parameter, 1: no weight decay (may be NULL) */
  uint64_t seed;
  fsdp_comm *shard;             /* the shard group */
  fsdp_comm *reduce;            /* its reductions: the same members on another channel, so
                                   they overlap the all-gathers on shard (NULL: shard); holds
                                   the shared reduce scratch */
  fsdp_comm *outer;             /* HSDP: the replicas (NULL: none) */
  fsdp_pool *param_pool;        /* zero 3: full param buffers */
  fsdp_pool *grad_pool;         /* zero 2/3: full grad buffers */
  fsdp_unit_config config;
} fsdp_unit_spec;
/* A unit of parameters sharded over spec->shard; materialises only this
 * rank's shard (meta init). */
int fsdp_unit_create(const fsdp_unit_spec *spec, fsdp_unit **out);
int fsdp_unit_destroy(fsdp_unit *u);
/* The unit's plan, as fsdp_unit_plan_make made it for this rank. */
int fsdp_unit_plan_get(const fsdp_unit *u, fsdp_unit_plan *out);
const fsdp_layout *fsdp_unit_layout(const fsdp_unit *u);
/* Start gathering the full params (zero 3; no-op otherwise). FSDP_DEFERRED:
 * not started, the pool is at its bound (prefetch stops there). */
int fsdp_unit_unshard(fsdp_unit *u);
/* unshard for a unit needed later: also FSDP_DEFERRED while the unit's
 * offloaded step is still running on the host, instead of waiting for it. */
int fsdp_unit_prefetch(fsdp_unit *u);
/* compute (NULL: the calling thread) waits until the full params are there. */
int fsdp_unit_wait(fsdp_unit *u, fsdp_stream *compute);
/* The full compute-dtype params (after wait), or NULL while sharded. */
void *fsdp_unit_params(fsdp_unit *u);
/* Give the full buffer back once compute's work so far is done (zero 3). */
int fsdp_unit_reshard(fsdp_unit *u, fsdp_stream *compute);
/* The full grad buffer to accumulate into (zeroed when first handed out). */
int fsdp_unit_grads(fsdp_unit *u, fsdp_stream *compute, void **out);
/* Reduce the grads written by compute so far: sync = 0 for a micro-batch
 * that is not the last (zero 0/1 then wait; zero 2/3 reduce-scatter and
 * accumulate into the fp32 shard), 1 for the last. Asynchronous. */
int fsdp_unit_reduce(fsdp_unit *u, fsdp_stream *compute, int sync);
int fsdp_unit_synchronize(fsdp_unit *u);
/* This rank's part of the squared grad norm (sum over the shard group gives
 * the unit's total) and its non-finite count. Call after synchronize. */
int fsdp_unit_grad_sumsq(fsdp_unit *u, double *sum, int64_t *nonfinite);
/* The same in two halves, so that the sum is computed while other units
 * still run their backward: start right after the unit's last reduce
 * (queued behind it on the comm stream: no host wait), get after the
 * backward (waits for the unit's streams; one small copy on a GPU). */
int fsdp_unit_grad_norm_start(fsdp_unit *u);
int fsdp_unit_grad_norm_get(fsdp_unit *u, double *sum, int64_t *nonfinite);
/* The part of this rank's sum of squares (grad_norm_get's) that the
 * parameters with which[i] != 0 make; after grad_norm_get. */
int fsdp_unit_grad_sumsq_params(fsdp_unit *u, const uint8_t *which, double *sum);
/* AdamW on the owned fp32 main params, write back to the compute params
 * (zero 3: the shard; zero 1/2: all-gathered into the full params), zero
 * the grads. An offloaded unit queues the step on the host and returns at
 * once: its next unshard / wait (or any call that reads its state) orders
 * the new params after it (src/shard/offload.c). */
int fsdp_unit_step(fsdp_unit *u, int64_t step, const fsdp_adamw_config *cfg, float grad_scale);
/* The same with SGD (momentum buffer in the AdamW m state). */
int fsdp_unit_step_sgd(fsdp_unit *u, int64_t step, float lr, float momentum, float weight_decay, float grad_scale);
/* Drop the reduced grads without a step (e.g. non-finite grads somewhere),
 * and any micro-batch sum begun (zero 0-1, fp32 sums); called before the
 * last reduce, also the grads the backward wrote since the last reduce (the
 * compute stream must have finished that backward). */
int fsdp_unit_zero_grad(fsdp_unit *u);
/* A view (no copy) of parameter i inside the unit's full buffers, shaped
 * (ndim, shape) with numel equal to the parameter's: which = FSDP_VIEW_PARAM
 * for its compute-dtype values (zero 3: after unshard + wait, until
 * reshard), FSDP_VIEW_GRAD for its full gradient (after fsdp_unit_grads,
 * until reduce). ESTATE while the buffer is not there. */
/* When the unit's last all-gather and last reduction (over the shard group)
 * began and ended on the comm stream, and its last offloaded step on the
 * host, in fsdp_time_now() seconds (0: none yet). Read after waiting for
 * that work (unit_wait, unit_synchronize). */
typedef struct fsdp_unit_times {
  double gather_begin, gather_end, reduce_begin, reduce_end, step_begin, step_end;
} fsdp_unit_times;
int fsdp_unit_times_get(const fsdp_unit *u, fsdp_unit_times *out);
/* A probe of the unit's next gather (FSDP_PROBE_GATHER: unshard's
 * all-gather) or reduction (FSDP_PROBE_REDUCE): two timed events
 * (fsdp_event_create_timed, on the unit's device) recorded on its comm
 * stream where the collective begins and ends, for a timeline of the comm
 * streams (fsdp.profile); the caller owns them and keeps them until read.
 * Used by one collective, then cleared. Returns 1 when the probe set before
 * was recorded, 0 when no collective took it (the call had nothing to do:
 * already gathered, or a micro-batch that only accumulates); begin = end =
 * NULL sets none. */
typedef enum { FSDP_PROBE_GATHER = 0, FSDP_PROBE_REDUCE = 1 } fsdp_unit_probe_kind;
int fsdp_unit_probe(fsdp_unit *u, int which, fsdp_event *begin, fsdp_event *end);
typedef enum { FSDP_VIEW_PARAM = 0, FSDP_VIEW_GRAD = 1 } fsdp_unit_view_kind;
int fsdp_unit_param_view(fsdp_unit *u, int param, int which, int ndim, const int64_t *shape, fsdp_tensor *out);

/* A unit's place in its step, as two named state machines
 * (src/shard/unit_lifecycle.c): its params (zero 3: sharded -> gathering
 * (unshard) -> gathered (wait) -> sharded (reshard); zero 0-2: resident) and
 * its grads (clean -> accumulating (grads) -> reduced (reduce of the last
 * micro-batch) -> clean (step or zero_grad)). A call the state does not
 * allow fails with FSDP_ESTATE and leaves the unit as it was. */
typedef enum { FSDP_PARAMS_SHARDED = 0, FSDP_PARAMS_GATHERING = 1, FSDP_PARAMS_GATHERED = 2, FSDP_PARAMS_RESIDENT = 3 } fsdp_unit_params_state;
typedef enum { FSDP_GRADS_CLEAN = 0, FSDP_GRADS_ACCUMULATING = 1, FSDP_GRADS_REDUCED = 2 } fsdp_unit_grads_state;
int fsdp_unit_states(const fsdp_unit *u, int *params, int *grads);
const char *fsdp_unit_params_state_name(int state);
const char *fsdp_unit_grads_state_name(int state);

/* Bytes this rank keeps resident for the unit, by kind (its plan's rows
 * summed; full buffers borrowed from the pools are not counted: the pools
 * own them). */
typedef struct fsdp_unit_memory {
  int64_t params_full;    /* compute-dtype full params (zero 0-2) */
  int64_t params_shard;   /* compute-dtype param shard (zero 1-3) */
  int64_t main_params;    /* fp32 main params (split: their low halves) */
  int64_t optimizer;      /* AdamW m and v */
  int64_t grads_full;     /* compute-dtype full grads (zero 0-1) */
  int64_t grads_main;     /* the grads the optimizer reads: fp32, or bf16 where compact (0:
                             they are the full grads); and zero 1's fp32 micro-batch sum */
  int64_t scratch;        /* 0: the fp32 reduce-scatter staging is shared by the
                             units of a shard group (fsdp_comm_scratch_bytes) */
  int64_t shard_numel, total_numel;
  int64_t offloaded;      /* of the above, bytes in host memory (offload), with the
                             host staging of the compute shard */
} fsdp_unit_memory;
int fsdp_unit_memory_info(const fsdp_unit *u, fsdp_unit_memory *out);

/* Phase offload (post-training, fsdp.engine: the device freed while a
 * rollout engine generates). offload: with the unit at rest (its pending
 * step applied, params sharded or resident, grads clean), every row it
 * holds on its device (params, grads, optimizer state) is copied to host
 * memory (pinned on a GPU) and its device memory freed, its shares of the
 * comms' scratch given back. onload: the rows back in new device memory,
 * bit for bit; params_only: the rows that hold the compute params alone (a
 * forward-only phase), the rest left in host memory until a full onload.
 * While a row is off the device the calls that need it are refused
 * (FSDP_ESTATE, naming the unit). Not with registered buffers
 * (fsdp.comm_register). Both are idempotent. */
typedef enum { FSDP_PLACED_DEVICE = 0, FSDP_PLACED_PARAMS = 1, FSDP_PLACED_HOST = 2 } fsdp_unit_placement;
int fsdp_unit_offload(fsdp_unit *u);
int fsdp_unit_onload(fsdp_unit *u, int params_only);
int fsdp_unit_placement_get(const fsdp_unit *u);

/* A unit's training state, for checkpoints (src/shard/unit_state.c): the
 * fp32 main params and the optimizer's arrays (AdamW: exp_avg, exp_avg_sq;
 * SGD: momentum in OPT1), as this rank holds them (fsdp_unit_state_numel
 * elements each). Pieces: param, element range [begin, end) and, in
 * shard_offset, where the range starts in the state arrays; to_save = 0:
 * every piece this rank holds, 1: the disjoint part it saves. Returns the
 * count (may exceed cap). get / set copy to and from host memory (split
 * main params are joined and split there). */
typedef enum { FSDP_STATE_PARAM = 0, FSDP_STATE_OPT1 = 1, FSDP_STATE_OPT2 = 2 } fsdp_unit_state_kind;
int fsdp_unit_state_pieces(const fsdp_unit *u, int to_save, fsdp_layout_piece *out, int cap);
int64_t fsdp_unit_state_numel(const fsdp_unit *u);
int fsdp_unit_state_get(fsdp_unit *u, int kind, int64_t off, int64_t n, float *dst);
int fsdp_unit_state_set(fsdp_unit *u, int kind, int64_t off, int64_t n, const float *src);
/* After setting the main params: the compute params from them (collective
 * over the shard group, and the outer group with hfsdp). */
int fsdp_unit_state_publish(fsdp_unit *u);

#ifdef __cplusplus
}
#endif
#endif /* FSDP_SHARD_API_H */
