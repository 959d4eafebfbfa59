/* unit.c: an FSDP unit's life: creation from its plan (unit_plan.c says
 * which buffers; this allocates exactly those and draws the owned shard's
 * initial values), destruction, and what callers read of it (its layout,
 * plan and memory, the element ranges its optimizer owns). The gather /
 * reduce machinery and the views into the full buffers are unit_comm.c,
 * the optimizer step unit_step.c and unit_apply.c; unit_impl.h draws the map. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>

#include "../base/bf16_split.h"
#include "../base/error.h"
#include "../device/cuda_backend.h"
#include "../fsdp_shard.h"
#include "unit_impl.h"

static int check_spec(const fsdp_unit_spec *sp) {
  const char *name = sp->name;
  const fsdp_unit_config *cfg = &sp->config;
  /* the config's own rules: the planner's (fsdp_unit_plan_make runs them too) */
  int rc = fsdp_unit_config_check(cfg, sp->outer ? sp->outer->size : 1);
  if (rc < 0) return fsdp_fail_context(rc, "unit '%s'", name);
  if (sp->nparams < 0 || (sp->nparams > 0 && (!sp->param_names || !sp->numels || !sp->rules)))
    return fsdp_fail(FSDP_EINVAL, "unit '%s': %d parameters but no names, sizes or init rules", name, sp->nparams);
  fsdp_comm *shard = sp->shard, *reduce = sp->reduce, *outer = sp->outer;
  if (reduce && (reduce->size != shard->size || reduce->rank != shard->rank || reduce->device != shard->device))
    return fsdp_fail(FSDP_EINVAL, "unit '%s': the reduce comm '%s' (rank %d of %d) is not the shard group '%s' (rank %d "
                     "of %d) on another channel", name, reduce->name, reduce->rank, reduce->size, shard->name,
                     shard->rank, shard->size);
  if (outer && outer->device != shard->device)
    return fsdp_fail(FSDP_EINVAL, "unit '%s': the shard group is on %s, the outer group on %s: one device for both",
                     name, shard->device == FSDP_CUDA ? "cuda" : "cpu", outer->device == FSDP_CUDA ? "cuda" : "cpu");
  if ((cfg->offload & FSDP_OFFLOAD_GRADS) && outer)
    return fsdp_fail(FSDP_EINVAL, "unit '%s': offloading the grads needs no outer (HSDP) group: replicas agree on the "
                     "device before the grads go down", name);
  if (cfg->hfsdp && (!outer || cfg->zero == 0))
    return fsdp_fail(FSDP_EINVAL, "unit '%s': hfsdp shards the optimizer over the outer group: it needs an outer "
                     "group and zero >= 1", name);
  return FSDP_OK;
}

/* ---- host copies of rows (unit_phase.c's offload) ---- */

/* host memory for a row: pinned on a GPU; on the CPU in 2 MiB-aligned
 * blocks the kernel may back with huge pages (first touch faults 512x
 * fewer pages: the first offload of a large state is page faults, not copies) */
int fsdp_unit_host_alloc(const fsdp_unit *u, size_t bytes, void **out) {
  if (u->device == FSDP_CUDA) return fsdp_alloc_host_pinned(bytes ? bytes : 1, out);
  const size_t huge = (size_t)2 << 20;
  *out = NULL;
  if (bytes >= huge) {
    if (posix_memalign(out, huge, (bytes + huge - 1) / huge * huge) != 0) *out = NULL;
#ifdef MADV_HUGEPAGE
    if (*out) madvise(*out, (bytes + huge - 1) / huge * huge, MADV_HUGEPAGE);
#endif
  } else {
    *out = malloc(bytes ? bytes : 1);
  }
  return *out ? FSDP_OK : fsdp_fail(FSDP_ENOMEM, "unit '%s': no host memory for %zu bytes", u->name, bytes);
}

void fsdp_unit_host_free(const fsdp_unit *u, void *p) {
  if (!p) return;
  if (u->device == FSDP_CUDA) fsdp_free_host_pinned(p);
  else free(p);
}

void fsdp_unit_phase_free(fsdp_unit *u) {
  for (int i = 0; i < FSDP_UBUF_COUNT; i++) {
    fsdp_unit_host_free(u, u->parked[i]);
    fsdp_unit_host_free(u, u->kept[i]);
    u->parked[i] = u->kept[i] = NULL;
  }
}

/* ---- a row of the plan: allocate, free ---- */

int fsdp_unit_alloc_zeroed(int device, size_t bytes, void **out) {
  FSDP_CHECK(fsdp_alloc(device, bytes, out));
  if (device == FSDP_CUDA) return fsdp_memset(*out, 0, bytes, NULL);
  memset(*out, 0, bytes ? bytes : 1);
  return FSDP_OK;
}

/* a buffer the shard group's collectives read or write: from the comm and
 * registered with it when the config asks (fsdp.comm_register) */
static int alloc_comm(fsdp_unit *u, fsdp_comm *c, size_t bytes, void **out) {
  int mode = u->cfg.comm_register;
  if (!mode) return fsdp_unit_alloc_zeroed(u->device, bytes, out);
  FSDP_CHECK(fsdp_comm_mem_alloc(c, mode, bytes, out));
  u->registered_with[u->nregistrations] = c;
  return fsdp_comm_register(c, *out, bytes, mode, &u->registrations[u->nregistrations++]);
}

/* the row's memory: its own (device, host, or from comm c for collectives),
 * or the row it aliases; NULL where the unit holds none */
static int alloc_row(fsdp_unit *u, int row, fsdp_comm *c, void **rows, void **out) {
  const fsdp_unit_buffer_row *b = &u->plan.rows[row];
  *out = NULL;
  if (b->held == FSDP_HELD_NOT) return FSDP_OK;
  if (b->held == FSDP_HELD_ALIAS) {
    *out = rows[b->alias_of];
    return FSDP_OK;
  }
  size_t bytes = (size_t)b->bytes;
  if (b->held == FSDP_HELD_HOST && u->device == FSDP_CUDA) { /* pinned: copies run asynchronously */
    FSDP_CHECK(fsdp_alloc_host_pinned(bytes ? bytes : 1, out));
    memset(*out, 0, bytes ? bytes : 1);
    return FSDP_OK;
  }
  if (b->held == FSDP_HELD_DEVICE && b->comm) return alloc_comm(u, c, bytes, out);
  return fsdp_unit_alloc_zeroed(u->device, bytes, out);
}

static void free_row(fsdp_unit *u, int row, fsdp_comm *c, void *p) {
  const fsdp_unit_buffer_row *b = &u->plan.rows[row];
  if (!p || b->held == FSDP_HELD_NOT || b->held == FSDP_HELD_ALIAS) return;
  if (b->held == FSDP_HELD_HOST && u->device == FSDP_CUDA) fsdp_free_host_pinned(p);
  else if (b->held == FSDP_HELD_DEVICE && b->comm && u->cfg.comm_register) fsdp_comm_mem_free(c, u->cfg.comm_register, p);
  else fsdp_free(u->device, p);
}

/* the comm a row's collectives use (registration): the reduce comm for the
 * full grads, the shard group's for the rest */
static fsdp_comm *comm_of(const fsdp_unit *u, int row) {
  return row == FSDP_UBUF_GRADS_FULL ? u->reduce_comm : u->shard_comm;
}

/* the unit's fields from the rows' memory, by fsdp_unit_buffer (aliases
 * resolved by the caller) */
void fsdp_unit_rows_set(fsdp_unit *u, void *const rows[FSDP_UBUF_COUNT]) {
  if (u->main_split) u->main_low = rows[FSDP_UBUF_MAIN_PARAMS];
  else u->main_params = rows[FSDP_UBUF_MAIN_PARAMS];
  u->opt1 = rows[FSDP_UBUF_OPT1];
  u->opt2 = rows[FSDP_UBUF_OPT2];
  u->main_grads = rows[FSDP_UBUF_MAIN_GRADS];
  if (!u->grads_compact)
    u->grad_accum = rows[FSDP_UBUF_GRAD_ACCUM] ? rows[FSDP_UBUF_GRAD_ACCUM] : rows[FSDP_UBUF_MAIN_GRADS];
  u->param_shard = rows[FSDP_UBUF_PARAM_SHARD];
  u->params_full = rows[FSDP_UBUF_PARAMS_FULL];
  u->grads_full = rows[FSDP_UBUF_GRADS_FULL];
  u->host_stage = rows[FSDP_UBUF_HOST_STAGE];
  u->grads_sum = rows[FSDP_UBUF_GRADS_SUM];
}

/* the rows' memory from the unit's fields (an alias row: its target's) */
void fsdp_unit_rows_get(const fsdp_unit *u, void *rows[FSDP_UBUF_COUNT]) {
  void *main = u->main_split ? (void *)u->main_low : (void *)u->main_params;
  void *r[FSDP_UBUF_COUNT] = {main,           u->opt1,        u->opt2,       u->main_grads, NULL,
                              u->param_shard, u->params_full, u->grads_full, u->host_stage, u->grads_sum};
  if (u->grad_accum != u->main_grads) r[FSDP_UBUF_GRAD_ACCUM] = u->grad_accum; /* (NULL: compact) */
  memcpy(rows, r, sizeof r);
}

static int alloc_rows(fsdp_unit *u) {
  void *rows[FSDP_UBUF_COUNT] = {0};
  /* held rows first, then the aliases of any of them */
  for (int alias = 0; alias <= 1; alias++)
    for (int i = 0; i < FSDP_UBUF_COUNT; i++)
      if ((u->plan.rows[i].held == FSDP_HELD_ALIAS) == alias) FSDP_CHECK(alloc_row(u, i, comm_of(u, i), rows, &rows[i]));
  fsdp_unit_rows_set(u, rows);
  return FSDP_OK;
}

static void free_rows(fsdp_unit *u) {
  void *rows[FSDP_UBUF_COUNT]; /* (rows offloaded by fsdp_unit_offload are NULL here, their host copies in u->parked) */
  fsdp_unit_rows_get(u, rows);
  fsdp_unit_phase_free(u);
  for (int i = 0; i < u->nregistrations; i++) fsdp_comm_deregister(u->registered_with[i], u->registrations[i]);
  for (int i = 0; i < FSDP_UBUF_COUNT; i++) free_row(u, i, comm_of(u, i), rows[i]);
}

void *fsdp_unit_inplace_stage(const fsdp_unit *u) {
  if (u->compute_is_main || u->hfsdp) return NULL;
  return u->cfg.zero == 0 ? u->params_full : u->param_shard;
}

int fsdp_unit_split_params(fsdp_unit *u, int64_t off, int64_t n, float *dst, const float *src) {
  uint16_t *high = (uint16_t *)fsdp_unit_inplace_stage(u) + off, *low = u->main_low + off, *h = NULL;
  size_t bytes = (size_t)n * 2;
  FSDP_CHECK(fsdp_host_alloc(2 * (bytes ? bytes : 1), (void **)&h));
  uint16_t *l = h + n;
  int rc = FSDP_OK;
  if (u->device == FSDP_CUDA && fsdp_cuda()->is_device_ptr(dst ? (const void *)dst : (const void *)src))
    rc = fsdp_fail(FSDP_EINVAL, "unit '%s': the state of split main params goes to and from host memory", u->name);
  else if (dst) {
    rc = fsdp_memcpy(h, high, bytes, NULL);
    if (rc == FSDP_OK) rc = fsdp_memcpy(l, low, bytes, NULL);
    for (int64_t i = 0; rc == FSDP_OK && i < n; i++) dst[i] = fsdp_bf16_join(h[i], l[i]);
  } else {
    for (int64_t i = 0; i < n; i++) h[i] = fsdp_bf16_round_away(src[i]), l[i] = fsdp_bf16_low(src[i]);
    rc = fsdp_memcpy(high, h, bytes, NULL);
    if (rc == FSDP_OK) rc = fsdp_memcpy(low, l, bytes, NULL);
  }
  fsdp_host_free(h);
  return rc;
}

/* meta init: only the owned shard is drawn (zero 0 draws every shard), on
 * the host (the RNG is the CPU's: the same values on every device), copied
 * into the main params, and cast on the host for the compute params */
static int init_values(fsdp_unit *u, const fsdp_unit_spec *sp) {
  int z = u->cfg.zero, dt = u->cfg.compute_dtype;
  int64_t S = u->shard_numel, n = z == 0 ? u->total_numel : S;
  size_t f = sizeof(float), bytes = (size_t)(n ? n : 1) * u->compute_size;
  float *init = NULL;
  void *cast = NULL;
  FSDP_CHECK(fsdp_host_alloc((size_t)(n ? n : 1) * f, (void **)&init));
  int rc = fsdp_host_alloc(bytes, &cast);
  for (int q = 0; rc == FSDP_OK && z == 0 && q < u->shard_ranks; q++)
    rc = fsdp_layout_init_shard(u->layout, q, sp->param_names, sp->rules, sp->seed, init + q * S, FSDP_FP32);
  if (rc == FSDP_OK && z >= 1)
    rc = fsdp_layout_init_shard(u->layout, u->shard_rank, sp->param_names, sp->rules, sp->seed, init, FSDP_FP32);
  /* the optimizer keeps its range of the shard; split main params are the
   * compute params (all of them: no HFSDP) and their low halves */
  const float *opt = init + (z >= 1 ? u->opt_offset : 0);
  if (rc == FSDP_OK && u->main_split) rc = fsdp_unit_split_params(u, 0, u->opt_numel, NULL, opt);
  else if (rc == FSDP_OK) rc = fsdp_memcpy(u->main_params, opt, (size_t)u->opt_numel * f, NULL);
  /* the compute params, where they are neither the main params nor their high halves (or the host stage) */
  if (rc == FSDP_OK && !u->compute_is_main && !u->main_split)
    rc = fsdp_unit_cast_out(u->params_on_host ? u->host_stage : cast, dt, init, n, NULL);
  void *compute = z == 0 ? u->params_full : u->param_shard;
  if (rc == FSDP_OK && !u->params_on_host && !u->compute_is_main && !u->main_split)
    rc = fsdp_memcpy(compute, cast, (size_t)n * u->compute_size, NULL);
  fsdp_host_free(cast);
  fsdp_host_free(init);
  FSDP_CHECK(rc);
  if (z == 1 || z == 2) {
    FSDP_CHECK(fsdp_comm_all_gather(u->shard_comm, u->params_full, u->param_shard, (size_t)S, dt));
    FSDP_CHECK(fsdp_event_record(u->gathered, u->shard_comm->stream));
  }
  return FSDP_OK;
}

static int build(fsdp_unit *u, const fsdp_unit_spec *sp) {
  const fsdp_unit_config *cfg = &sp->config;
  int R = cfg->hfsdp ? sp->outer->size : 1;
  /* HFSDP splits each shard R ways: keep shards a multiple of R */
  FSDP_CHECK(fsdp_layout_create(sp->nparams, sp->numels, u->shard_ranks, cfg->param_align, cfg->shard_align * R,
                                &u->layout));
  FSDP_CHECK(fsdp_unit_plan_make(cfg, u->layout, u->device, sp->outer ? sp->outer->size : 1,
                                 sp->outer ? sp->outer->rank : 0, &u->plan));
  const fsdp_unit_plan *p = &u->plan;
  if (p->pool_params && !sp->param_pool)
    return fsdp_fail(FSDP_EINVAL, "zero 3 over %d ranks needs a param pool", u->shard_ranks);
  if (p->pool_grads && !sp->grad_pool) return fsdp_fail(FSDP_EINVAL, "zero 2 and 3 need a grad pool");
  u->shard_numel = p->shard_numel;
  u->total_numel = p->total_numel;
  u->opt_numel = p->opt_numel;
  u->opt_offset = p->opt_offset;
  u->compute_is_main = p->compute_is_main;
  u->main_split = p->main_split;
  u->grads_compact = p->grads_compact;
  u->main_grad_dtype = p->grads_compact ? cfg->compute_dtype : FSDP_FP32;
  u->sums_fp32 = p->sums_fp32;
  u->reduce_path = p->grads_compact ? UNIT_REDUCE_COMPACT
                   : cfg->zero == 0 ? UNIT_REDUCE_ALL_REDUCE
                   : cfg->zero == 1 ? UNIT_REDUCE_SCATTER_FULL
                                    : UNIT_REDUCE_SCATTER_EACH;
  size_t np = (size_t)(sp->nparams ? sp->nparams : 1);
  u->no_decay = calloc(np, 1);
  u->numels = calloc(np, sizeof(int64_t));
  if (!u->no_decay || !u->numels) return fsdp_fail(FSDP_ENOMEM, "out of memory");
  if (sp->no_decay) memcpy(u->no_decay, sp->no_decay, (size_t)sp->nparams);
  if (sp->nparams) memcpy(u->numels, sp->numels, sizeof(int64_t) * (size_t)sp->nparams);
  FSDP_CHECK(alloc_rows(u));
  if (p->reduce_scratch) {
    FSDP_CHECK(fsdp_comm_scratch_reserve(u->reduce_comm, (size_t)p->reduce_scratch));
    u->holds_reduce_scratch = 1;
  }
  if (p->gather_stage) {
    FSDP_CHECK(fsdp_comm_scratch_reserve(u->shard_comm, (size_t)p->gather_stage));
    u->holds_gather_stage = 1;
  }
  if (u->offload) FSDP_CHECK(fsdp_offload_attach(u));
  if (p->norm_sums) FSDP_CHECK(fsdp_unit_alloc_zeroed(u->device, (size_t)p->norm_sums, &u->norm_device));
  FSDP_CHECK(fsdp_event_create(u->device, &u->gathered));
  FSDP_CHECK(fsdp_event_create(u->device, &u->handoff));
  if ((u->reduce_comm != u->shard_comm || u->grads_compact) && u->device == FSDP_CUDA)
    FSDP_CHECK(fsdp_event_create(u->device, &u->grads_zeroed));
  if (u->sums_fp32) FSDP_CHECK(fsdp_event_create(u->device, &u->grads_free));
  return init_values(u, sp);
}

int fsdp_unit_create(const fsdp_unit_spec *sp, fsdp_unit **out) {
  if (!out || !sp || !sp->shard || !sp->name) return fsdp_fail(FSDP_EINVAL, "unit_create: NULL argument");
  *out = NULL;
  FSDP_CHECK(check_spec(sp));
  fsdp_unit *u = calloc(1, sizeof *u);
  if (!u) return fsdp_fail(FSDP_ENOMEM, "unit '%s': out of memory", sp->name);
  snprintf(u->name, sizeof u->name, "%s", sp->name);
  u->cfg = sp->config;
  u->nparams = sp->nparams;
  u->shard_comm = sp->shard;
  u->reduce_comm = sp->reduce ? sp->reduce : sp->shard;
  u->outer_comm = sp->outer;
  u->param_pool = sp->param_pool;
  u->grad_pool = sp->grad_pool;
  /* the unit holds what it uses, so a mesh or pool freed first (the
   * collector at exit keeps no order) lives on until the unit is gone */
  fsdp_comm_retain(u->shard_comm);
  fsdp_comm_retain(u->reduce_comm);
  fsdp_comm_retain(u->outer_comm);
  fsdp_pool_retain(u->param_pool);
  fsdp_pool_retain(u->grad_pool);
  u->shard_ranks = sp->shard->size;
  u->shard_rank = sp->shard->rank;
  u->device = sp->shard->device;
  u->param_slot = u->grad_slot = -1;
  u->params_state = sp->config.zero == 3 ? FSDP_PARAMS_SHARDED : FSDP_PARAMS_RESIDENT;
  u->grads_state = FSDP_GRADS_CLEAN;
  u->compute_size = fsdp_dtype_size(sp->config.compute_dtype);
  u->hfsdp = sp->config.hfsdp != 0;
  u->offload = sp->config.offload != 0;
  u->params_on_host = (sp->config.offload & FSDP_OFFLOAD_PARAMS) && u->device == FSDP_CUDA;
  u->grads_on_host = (sp->config.offload & FSDP_OFFLOAD_GRADS) != 0;
  int rc = build(u, sp);
  if (rc < 0) {
    fsdp_unit_destroy(u);
    return fsdp_fail_context(rc, "unit '%s'", sp->name);
  }
  *out = u;
  return FSDP_OK;
}

int fsdp_unit_destroy(fsdp_unit *u) {
  if (!u) return FSDP_OK;
  fsdp_offload_detach(u);
  /* the streams may still work on its buffers */
  if (u->shard_comm) fsdp_stream_synchronize(u->shard_comm->stream);
  if (u->reduce_comm && u->reduce_comm != u->shard_comm) fsdp_stream_synchronize(u->reduce_comm->stream);
  if (u->outer_comm) fsdp_stream_synchronize(u->outer_comm->stream);
  if (u->param_slot >= 0) fsdp_pool_give_back(u->param_pool, u->param_slot, NULL);
  if (u->grad_slot >= 0) fsdp_pool_give_back(u->grad_pool, u->grad_slot, NULL);
  /* the scratch shares it holds where it is (unit_phase.c) */
  if (u->holds_reduce_scratch && u->placed == FSDP_PLACED_DEVICE) fsdp_comm_scratch_release(u->reduce_comm);
  if (u->holds_gather_stage && u->placed != FSDP_PLACED_HOST) fsdp_comm_scratch_release(u->shard_comm);
  free_rows(u);
  fsdp_free(u->device, u->norm_device);
  fsdp_event_destroy(u->gathered);
  fsdp_event_destroy(u->handoff);
  fsdp_event_destroy(u->grads_zeroed);
  fsdp_event_destroy(u->grads_free);
  fsdp_layout_destroy(u->layout);
  fsdp_pool_release(u->param_pool);
  fsdp_pool_release(u->grad_pool);
  fsdp_comm_release(u->outer_comm);
  fsdp_comm_release(u->reduce_comm);
  fsdp_comm_release(u->shard_comm);
  free(u->no_decay);
  free(u->numels);
  free(u);
  return FSDP_OK;
}

/* ---- what callers read ---- */

const fsdp_layout *fsdp_unit_layout(const fsdp_unit *u) { return u ? u->layout : NULL; }

int fsdp_unit_plan_get(const fsdp_unit *u, fsdp_unit_plan *out) {
  if (!u || !out) return fsdp_fail(FSDP_EINVAL, "unit_plan_get: NULL argument");
  *out = u->plan;
  return FSDP_OK;
}

int fsdp_unit_memory_info(const fsdp_unit *u, fsdp_unit_memory *out) {
  if (!u || !out) return fsdp_fail(FSDP_EINVAL, "unit_memory_info: NULL argument");
  const fsdp_unit_buffer_row *r = u->plan.rows;
  int64_t host = 0;
  for (int i = 0; i < FSDP_UBUF_COUNT; i++)
    if (r[i].held == FSDP_HELD_HOST) host += r[i].bytes;
  *out = (fsdp_unit_memory){
      .params_full = r[FSDP_UBUF_PARAMS_FULL].bytes,
      .params_shard = r[FSDP_UBUF_PARAM_SHARD].bytes,
      .main_params = r[FSDP_UBUF_MAIN_PARAMS].bytes,
      .optimizer = r[FSDP_UBUF_OPT1].bytes + r[FSDP_UBUF_OPT2].bytes,
      .grads_full = r[FSDP_UBUF_GRADS_FULL].bytes,
      .grads_main = r[FSDP_UBUF_MAIN_GRADS].bytes + r[FSDP_UBUF_GRAD_ACCUM].bytes + r[FSDP_UBUF_GRADS_SUM].bytes,
      .scratch = 0, /* shared by the group's units: fsdp_comm_scratch_bytes */
      .shard_numel = u->shard_numel,
      .total_numel = u->total_numel,
      .offloaded = host,
  };
  return FSDP_OK;
}

int fsdp_unit_times_get(const fsdp_unit *u, fsdp_unit_times *out) {
  if (!u || !out) return fsdp_fail(FSDP_EINVAL, "unit_times_get: NULL argument");
  *out = u->times;
  return FSDP_OK;
}

/* ---- the element ranges the optimizer holds ---- */

/* append piece (param, begin, end at optimizer offset off) when out != NULL
 * and there is room; count it either way */
static void put(fsdp_layout_piece *out, int cap, int *k, int param, int rank, int64_t begin, int64_t end, int64_t off) {
  if (out && *k < cap)
    out[*k] = (fsdp_layout_piece){.param = param, .rank = rank, .begin = begin, .end = end, .shard_offset = off};
  (*k)++;
}

/* A rank holds the pieces of its shard inside the optimizer's range (zero
 * 0: every parameter whole). It saves a disjoint part of them, so that each
 * element is written once across the job: its own layout pieces at zero 0,
 * nothing on HSDP replicas other than the first (they hold the same
 * values), its 1/R range with HFSDP. */
int fsdp_unit_state_pieces(const fsdp_unit *u, int to_save, fsdp_layout_piece *out, int cap) {
  if (!u) return fsdp_fail(FSDP_EINVAL, "unit_state_pieces: NULL unit");
  const fsdp_layout *l = u->layout;
  int k = 0, r = u->shard_rank;
  if (to_save && u->outer_comm && !u->hfsdp && u->outer_comm->rank != 0) return 0; /* a replica: the first one saves */
  if (u->cfg.zero == 0 && !to_save) {
    for (int p = 0; p < u->nparams; p++) put(out, cap, &k, p, r, 0, u->numels[p], fsdp_layout_param_offset(l, p));
    return k;
  }
  int n = fsdp_layout_rank_pieces(l, r, NULL, 0);
  fsdp_layout_piece *ps = malloc(sizeof *ps * (size_t)(n ? n : 1));
  if (!ps) return fsdp_fail(FSDP_ENOMEM, "unit '%s': out of memory", u->name);
  fsdp_layout_rank_pieces(l, r, ps, n);
  for (int j = 0; j < n; j++) {
    if (u->cfg.zero == 0) { /* the full copy: this rank's slice of it */
      put(out, cap, &k, ps[j].param, r, ps[j].begin, ps[j].end, (int64_t)r * u->shard_numel + ps[j].shard_offset);
      continue;
    }
    int64_t lo = ps[j].shard_offset, hi = lo + (ps[j].end - ps[j].begin); /* clipped to the optimizer's range */
    if (lo < u->opt_offset) lo = u->opt_offset;
    if (hi > u->opt_offset + u->opt_numel) hi = u->opt_offset + u->opt_numel;
    if (lo < hi)
      put(out, cap, &k, ps[j].param, r, ps[j].begin + (lo - ps[j].shard_offset),
          ps[j].begin + (hi - ps[j].shard_offset), lo - u->opt_offset);
  }
  free(ps);
  return k;
}

int fsdp_unit_owned_pieces(const fsdp_unit *u, fsdp_layout_piece **out) {
  int k = fsdp_unit_state_pieces(u, 0, NULL, 0);
  FSDP_CHECK(k);
  *out = malloc(sizeof **out * (size_t)(k ? k : 1));
  if (!*out) return fsdp_fail(FSDP_ENOMEM, "unit '%s': out of memory", u->name);
  fsdp_unit_state_pieces(u, 0, *out, k);
  return k;
}
