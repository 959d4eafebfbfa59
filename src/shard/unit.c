/* unit.c: an FSDP unit: its parameters packed in one flat buffer (layout.c),
 * the buffers each ZeRO level keeps, and the unshard / reshard / reduce /
 * step state machine. Collectives run on the shard group's stream; host
 * work that must follow them (accumulating, casting, zeroing) is enqueued on
 * that same stream, so nothing here blocks the caller except step().
 *
 *   zero | full params | grads                         | fp32 main + AdamW state
 *   0    | resident    | full, all-reduced at sync     | full
 *   1    | resident    | full, reduce-scattered at sync| shard
 *   2    | resident    | shard (full buffer transient) | shard
 *   3    | gathered    | shard (full buffer transient) | shard
 *
 * Every buffer lives on the comm's device. On CPU ranks the steps between
 * collectives (accumulate, cast, zero) are tasks on the comm stream's
 * worker; on CUDA they are kernels (kernels/elementwise.cu) on the same
 * stream, and the optimizer runs as kernels (kernels/adamw.cu) on the shard
 * group's stream, so a step never blocks the host. The comm-stream time
 * stamps (fsdp_unit_times) are taken on CPU ranks only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/bf16.h"
#include "../base/error.h"
#include "../device/cuda_backend.h"
#include "../device/device_impl.h"
#include "../dist/comm_impl.h"
#include "pool.h"
#include "unit_impl.h"

/* the shared scratch of the unit's shard group, at least S fp32 elements */
#define TMP(u) ((float *)(u)->red->scratch)


/* ---- host steps enqueued behind collectives ---- */

typedef struct host_op {
  int kind; /* 0: dst(fp32) += src(dtype); 1: dst(fp32) = src(dtype); 2: zero dst bytes */
  float *dst;
  const void *src;
  int dtype;
  int64_t n;
} host_op;

static int run_host_op(void *arg) {
  host_op *o = arg;
  if (o->kind == 2) {
    memset(o->dst, 0, (size_t)o->n);
    return FSDP_OK;
  }
  if (o->dtype == FSDP_FP32) {
    const float *s = o->src;
    if (o->kind == 0)
      for (int64_t i = 0; i < o->n; i++) o->dst[i] += s[i];
    else
      memcpy(o->dst, s, (size_t)o->n * 4);
  } else {
    const uint16_t *s = o->src;
    if (o->kind == 0)
      for (int64_t i = 0; i < o->n; i++) o->dst[i] += fsdp_bf16_load(s[i]);
    else
      for (int64_t i = 0; i < o->n; i++) o->dst[i] = fsdp_bf16_load(s[i]);
  }
  return FSDP_OK;
}


static int enqueue_host(fsdp_stream *s, int kind, void *dst, const void *src, int dtype, int64_t n) {
  if (s->device == FSDP_CUDA) { /* the same steps as kernels on the stream */
    if (kind == 2) return fsdp_memset(dst, 0, (size_t)n, s);
    if (kind == 1 && dtype == FSDP_FP32) return fsdp_memcpy(dst, src, (size_t)n * 4, s);
    if (kind == 1) return fsdp_cuda()->cast_to_f32(dst, src, dtype, (size_t)n, s);
    return fsdp_cuda()->accumulate_f32(dst, src, dtype, (size_t)n, s);
  }
  host_op *o = malloc(sizeof *o);
  if (!o) return fsdp_fail(FSDP_ENOMEM, "unit: out of memory");
  *o = (host_op){kind, dst, src, dtype, n};
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

int fsdp_unit_times_get(const fsdp_unit *u, fsdp_unit_times *out) {
  if (!u || !out) return fsdp_fail(FSDP_EINVAL, "unit_times_get: NULL argument");
  *out = u->times;
  return FSDP_OK;
}

/* dst (compute dtype) = src (fp32): at once on CPU, on stream s on CUDA */
static int cast_out(void *dst, int dtype, const float *src, int64_t n, fsdp_stream *s) {
  if (s && s->device == FSDP_CUDA) {
    return fsdp_cuda()->cast_from_f32(dst, dtype, src, (size_t)n, s);
  }
  if (dtype == FSDP_FP32) {
    memcpy(dst, src, (size_t)n * 4);
  } else {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = fsdp_bf16_round(src[i]);
  }
  return FSDP_OK;
}

/* ---- creation ---- */

static int check_config(const char *name, const fsdp_unit_config *c) {
  if (c->zero < 0 || c->zero > 3) return fsdp_fail(FSDP_EINVAL, "unit '%s': zero = %d; expected 0, 1, 2 or 3", name, c->zero);
  if (c->compute_dtype != FSDP_FP32 && c->compute_dtype != FSDP_BF16)
    return fsdp_fail(FSDP_EINVAL, "unit '%s': compute dtype must be fp32 or bf16", name);
  if (c->reduce_dtype != FSDP_FP32 && c->reduce_dtype != c->compute_dtype)
    return fsdp_fail(FSDP_EINVAL, "unit '%s': reduce dtype must be fp32 or the compute dtype", name);
  if (c->grad_op != FSDP_AVG && c->grad_op != FSDP_SUM)
    return fsdp_fail(FSDP_EINVAL, "unit '%s': grad_op must be avg or sum", name);
  if (c->comm_register < FSDP_REG_NONE || c->comm_register > FSDP_REG_WINDOW)
    return fsdp_fail(FSDP_EINVAL, "unit '%s': comm_register = %d; expected 0 (none), 1 (buffers) or 2 (windows)", name,
                     c->comm_register);
  if (c->offload < 0 || c->offload > 7)
    return fsdp_fail(FSDP_EINVAL, "unit '%s': offload = %d; expected fsdp_offload_bits (0..7)", name, c->offload);
  if ((c->offload & FSDP_OFFLOAD_PARAMS) && c->zero != 3)
    return fsdp_fail(FSDP_EINVAL, "unit '%s': offloading the params needs zero 3 (zero %d)", name, c->zero);
  if (c->offload && (c->zero == 0 || c->hfsdp))
    return fsdp_fail(FSDP_EINVAL, "unit '%s': offload needs zero >= 1 and no hfsdp (zero %d%s)", name, c->zero,
                     c->hfsdp ? ", hfsdp" : "");
  return FSDP_OK;
}

static int alloc0(int dev, size_t bytes, void **out) {
  FSDP_CHECK(fsdp_alloc(dev, bytes, out));
  if (dev == FSDP_CUDA) return fsdp_memset(*out, 0, bytes, NULL);
  memset(*out, 0, bytes ? bytes : 1);
  return FSDP_OK;
}

/* a buffer the shard group's collectives read or write: from the comm and
 * registered with it when the config asks (fsdp.comm_register) */
static int alloc_comm(fsdp_unit *u, fsdp_comm *c, size_t bytes, void **out) {
  int mode = u->cfg.comm_register;
  if (!mode) return alloc0(u->dev, bytes, out);
  FSDP_CHECK(fsdp_comm_mem_alloc(c, mode, bytes, out));
  u->regc[u->nreg] = c;
  return fsdp_comm_register(c, *out, bytes, mode, &u->reg[u->nreg++]);
}

static void free_comm(fsdp_unit *u, fsdp_comm *c, void *p) {
  if (!u->cfg.comm_register) fsdp_free(u->dev, p);
  else fsdp_comm_mem_free(c, u->cfg.comm_register, p);
}

/* the optimizer's buffers: on the unit's device, or offloaded to host
 * memory (pinned when the unit is on a GPU, so copies run asynchronously) */
static int alloc_opt(fsdp_unit *u, size_t bytes, void **out) {
  if (!u->off || u->dev == FSDP_CPU) return alloc0(u->dev, bytes, out);
  FSDP_CHECK(fsdp_alloc_host_pinned(bytes ? bytes : 1, out));
  memset(*out, 0, bytes ? bytes : 1);
  return FSDP_OK;
}

static void free_opt(fsdp_unit *u, void *p) {
  if (!p) return;
  if (u->off && u->dev == FSDP_CUDA) fsdp_free_host_pinned(p);
  else fsdp_free(u->dev, p);
}

int fsdp_unit_create(const char *name, int nparams, const char *const *param_names, const int64_t *numels,
                     const fsdp_init_rule *rules, const uint8_t *no_decay, uint64_t seed, fsdp_comm *shard,
                     fsdp_comm *reduce, fsdp_comm *outer, const fsdp_unit_config *cfg, fsdp_pool *param_pool,
                     fsdp_pool *grad_pool, fsdp_unit **out) {
  if (!out || !cfg || !shard || !name) return fsdp_fail(FSDP_EINVAL, "unit_create: NULL argument");
  *out = NULL;
  FSDP_CHECK(check_config(name, cfg));
  if (reduce && (reduce->size != shard->size || reduce->rank != shard->rank || reduce->device != shard->device))
    return fsdp_fail(FSDP_EINVAL, "unit '%s': the reduce comm '%s' (rank %d of %d) is not the shard group '%s' (rank %d "
                     "of %d) on another channel", name, reduce->name, reduce->rank, reduce->size, shard->name,
                     shard->rank, shard->size);
  if (outer && outer->device != shard->device)
    return fsdp_fail(FSDP_EINVAL, "unit '%s': the shard group is on %s, the outer group on %s: one device for both",
                     name, shard->device == FSDP_CUDA ? "cuda" : "cpu", outer->device == FSDP_CUDA ? "cuda" : "cpu");
  if (cfg->zero == 3 && !param_pool) return fsdp_fail(FSDP_EINVAL, "unit '%s': zero 3 needs a param pool", name);
  if (cfg->zero >= 2 && !grad_pool) return fsdp_fail(FSDP_EINVAL, "unit '%s': zero 2 and 3 need a grad pool", name);
  if ((cfg->offload & FSDP_OFFLOAD_GRADS) && outer)
    return fsdp_fail(FSDP_EINVAL, "unit '%s': offloading the grads needs no outer (HSDP) group: replicas agree on the "
                     "device before the grads go down", name);
  if (cfg->hfsdp && (!outer || cfg->zero == 0))
    return fsdp_fail(FSDP_EINVAL, "unit '%s': hfsdp shards the optimizer over the outer group: it needs an outer "
                     "group and zero >= 1", name);
  fsdp_unit *u = calloc(1, sizeof *u);
  if (!u) return fsdp_fail(FSDP_ENOMEM, "unit '%s': out of memory", name);
  snprintf(u->name, sizeof u->name, "%s", name);
  u->cfg = *cfg;
  u->np = nparams;
  u->shard = shard;
  u->red = reduce ? reduce : shard;
  u->outer = outer;
  u->ppool = param_pool;
  u->gpool = grad_pool;
  u->W = shard->size;
  u->r = shard->rank;
  u->dev = shard->device;
  u->pslot = u->gslot = -1;
  u->ces = fsdp_dtype_size(cfg->compute_dtype);
  u->hf = cfg->hfsdp != 0;
  u->off = cfg->offload != 0;
  u->offp = (cfg->offload & FSDP_OFFLOAD_PARAMS) && u->dev == FSDP_CUDA;
  u->offg = (cfg->offload & FSDP_OFFLOAD_GRADS) != 0;
  int R = u->hf ? outer->size : 1;
  /* HFSDP splits each shard R ways: keep shards a multiple of R */
  int rc = fsdp_layout_create(nparams, numels, u->W, cfg->param_align, cfg->shard_align * R, &u->layout);
  if (rc == FSDP_OK) {
    u->S = fsdp_layout_shard_numel(u->layout);
    u->T = u->S * u->W;
    u->n_opt = cfg->zero == 0 ? u->T : u->S / R;
    u->sub = u->hf ? (int64_t)outer->rank * u->n_opt : 0;
    u->no_decay = calloc((size_t)(nparams ? nparams : 1), 1);
    u->numels = calloc((size_t)(nparams ? nparams : 1), sizeof(int64_t));
    if (!u->no_decay || !u->numels) {
      rc = fsdp_fail(FSDP_ENOMEM, "unit '%s': out of memory", name);
    } else {
      if (no_decay) memcpy(u->no_decay, no_decay, (size_t)nparams);
      if (nparams) memcpy(u->numels, numels, sizeof(int64_t) * (size_t)nparams);
    }
  }
  size_t f = sizeof(float);
  if (rc == FSDP_OK) rc = alloc_opt(u, (size_t)u->n_opt * f, (void **)&u->main);
  if (rc == FSDP_OK) rc = alloc_opt(u, (size_t)u->n_opt * f, (void **)&u->m);
  if (rc == FSDP_OK) rc = alloc_opt(u, (size_t)u->n_opt * f, (void **)&u->v);
  if (rc == FSDP_OK) rc = alloc_opt(u, (size_t)u->n_opt * f, (void **)&u->gmain);
  /* tmp: the shard group's shared scratch (reduce-scatter staging, casts) */
  if (rc == FSDP_OK) rc = fsdp_comm_scratch_reserve(u->red, (size_t)(u->S ? u->S : 1) * f);
  if (rc == FSDP_OK) u->has_scratch = 1;
  u->gacc = u->gmain;
  /* the grads accumulate on the device; HFSDP then reduce-scatters them over
   * the replicas, offload copies them down after the last micro-batch */
  if (rc == FSDP_OK && (u->hf || (u->off && !u->offg))) rc = alloc0(u->dev, (size_t)u->S * f, (void **)&u->gacc);
  if (rc == FSDP_OK && u->off && u->dev == FSDP_CUDA) rc = alloc_opt(u, (size_t)u->S * u->ces, &u->hstage);
  if (rc == FSDP_OK && u->off) rc = fsdp_offload_attach(u);
  if (rc == FSDP_OK && u->offp) rc = fsdp_comm_scratch_reserve(shard, (size_t)(u->S ? u->S : 1) * u->ces);
  if (rc == FSDP_OK && u->offp) u->has_gstage = 1;
  /* fp32 compute: the compute params are the main params (no copy), unless
   * the collectives need registered buffers, or the main params live
   * elsewhere (offload) or hold only a part of the shard (HFSDP) */
  u->alias = cfg->compute_dtype == FSDP_FP32 && !u->off && !u->hf && !cfg->comm_register;
  if (rc == FSDP_OK && cfg->zero >= 1 && u->alias) u->cshard = u->main;
  else if (rc == FSDP_OK && cfg->zero >= 1 && !u->offp) rc = alloc_comm(u, shard, (size_t)u->S * u->ces, &u->cshard);
  if (rc == FSDP_OK && cfg->zero == 0 && u->alias) u->cfull = u->main;
  else if (rc == FSDP_OK && cfg->zero <= 2) rc = alloc_comm(u, shard, (size_t)u->T * u->ces, &u->cfull);
  if (rc == FSDP_OK && cfg->zero <= 1) rc = alloc_comm(u, u->red, (size_t)u->T * u->ces, &u->gfull);
  if (rc == FSDP_OK && u->dev == FSDP_CUDA) rc = alloc0(u->dev, 16, &u->sums);
  if (rc == FSDP_OK) rc = fsdp_event_create(u->dev, &u->gathered);
  if (rc == FSDP_OK) rc = fsdp_event_create(u->dev, &u->ready);
  if (rc == FSDP_OK && u->red != shard && u->dev == FSDP_CUDA) rc = fsdp_event_create(u->dev, &u->zeroed);
  /* meta init: only the owned shard is drawn (zero 0 draws every shard),
   * on the host (the RNG is the CPU's: the same values on every device),
   * then copied to the device */
  float *init = NULL;
  int64_t ninit = cfg->zero == 0 ? u->T : u->S;
  if (rc == FSDP_OK) rc = fsdp_host_alloc((size_t)(ninit ? ninit : 1) * f, (void **)&init);
  for (int q = 0; rc == FSDP_OK && cfg->zero == 0 && q < u->W; q++)
    rc = fsdp_layout_init_shard(u->layout, q, param_names, rules, seed, init + q * u->S, FSDP_FP32);
  if (rc == FSDP_OK && cfg->zero >= 1) rc = fsdp_layout_init_shard(u->layout, u->r, param_names, rules, seed, init, FSDP_FP32);
  /* the optimizer keeps its range of the shard; tmp holds the whole shard */
  if (rc == FSDP_OK) rc = fsdp_memcpy(u->main, init + (cfg->zero >= 1 ? u->sub : 0), (size_t)u->n_opt * f, NULL);
  if (rc == FSDP_OK && cfg->zero >= 1 && !u->offp) rc = fsdp_memcpy(TMP(u), init, (size_t)u->S * f, NULL);
  if (rc == FSDP_OK && u->offp) rc = cast_out(u->hstage, cfg->compute_dtype, init, u->S, NULL); /* the shard, on the host */
  fsdp_host_free(init);
  fsdp_stream *cs0 = shard->stream;
  if (rc == FSDP_OK) {
    if (cfg->zero == 0 && !u->alias) rc = cast_out(u->cfull, cfg->compute_dtype, u->main, u->T, cs0);
    if (cfg->zero >= 1 && !u->offp && !u->alias && rc == FSDP_OK)
      rc = cast_out(u->cshard, cfg->compute_dtype, TMP(u), u->S, cs0);
    if (rc == FSDP_OK && u->dev == FSDP_CUDA) rc = fsdp_stream_synchronize(cs0);
    if (cfg->zero == 1 || cfg->zero == 2) {
      rc = fsdp_comm_all_gather(shard, u->cfull, u->cshard, (size_t)u->S, cfg->compute_dtype);
      if (rc == FSDP_OK) rc = fsdp_event_record(u->gathered, shard->stream);
    }
  }
  if (rc < 0) {
    fsdp_unit_destroy(u);
    return fsdp_fail_context(rc, "unit '%s'", name);
  }
  *out = u;
  return FSDP_OK;
}

int fsdp_unit_destroy(fsdp_unit *u) {
  if (!u) return FSDP_OK;
  fsdp_offload_detach(u);
  if (u->shard) fsdp_stream_synchronize(u->shard->stream);
  if (u->red && u->red != u->shard) fsdp_stream_synchronize(u->red->stream);
  if (u->outer) fsdp_stream_synchronize(u->outer->stream);
  if (u->pslot >= 0) fsdp_pool_release(u->ppool, u->pslot, NULL);
  if (u->gslot >= 0) fsdp_pool_release(u->gpool, u->gslot, NULL);
  if (u->gacc != u->gmain) fsdp_free(u->dev, u->gacc);
  if (u->has_scratch) fsdp_comm_scratch_release(u->red);
  if (u->has_gstage) fsdp_comm_scratch_release(u->shard);
  for (int i = 0; i < u->nreg; i++) fsdp_comm_deregister(u->regc[i], u->reg[i]);
  if (u->cshard != u->main) free_comm(u, u->shard, u->cshard);
  if (u->cfull != u->main) free_comm(u, u->shard, u->cfull);
  free_comm(u, u->red, u->gfull);
  fsdp_free(u->dev, u->sums);
  void *opt[] = {u->main, u->m, u->v, u->gmain, u->hstage};
  for (size_t i = 0; i < sizeof opt / sizeof opt[0]; i++) free_opt(u, opt[i]);
  fsdp_event_destroy(u->gathered);
  fsdp_event_destroy(u->ready);
  if (u->zeroed) fsdp_event_destroy(u->zeroed);
  fsdp_layout_destroy(u->layout);
  free(u->no_decay);
  free(u->numels);
  free(u);
  return FSDP_OK;
}

const fsdp_layout *fsdp_unit_layout(const fsdp_unit *u) { return u ? u->layout : NULL; }

/* ---- forward: params ---- */

int fsdp_unit_unshard(fsdp_unit *u) {
  FSDP_CHECK(fsdp_offload_settle(u));
  if (u->cfg.zero != 3 || u->pslot >= 0) return FSDP_OK;
  fsdp_stream *cs = u->shard->stream;
  int rc = fsdp_pool_acquire(u->ppool, (size_t)u->T * u->ces, cs, &u->pslot, &u->pbuf);
  if (rc != FSDP_OK) return rc; /* 1: at the bound */
  FSDP_CHECK(enqueue_stamp(cs, &u->times.gather_begin));
  const void *in = u->cshard;
  if (u->offp) { /* the shard lives on the host: up into the comm's staging, in stream order */
    FSDP_CHECK(fsdp_memcpy(u->shard->scratch, u->hstage, (size_t)u->S * u->ces, cs));
    in = u->shard->scratch;
  }
  FSDP_CHECK(fsdp_comm_all_gather(u->shard, u->pbuf, in, (size_t)u->S, u->cfg.compute_dtype));
  FSDP_CHECK(enqueue_stamp(cs, &u->times.gather_end));
  return fsdp_event_record(u->gathered, cs);
}

int fsdp_unit_prefetch(fsdp_unit *u) {
  int busy = fsdp_offload_busy(u);
  FSDP_CHECK(busy);
  return busy ? 1 : fsdp_unit_unshard(u);
}

int fsdp_unit_wait(fsdp_unit *u, fsdp_stream *compute) {
  FSDP_CHECK(fsdp_offload_settle(u));
  if (u->cfg.zero == 3 && u->pslot < 0)
    return fsdp_fail(FSDP_ESTATE, "unit '%s': wait() before unshard() (or unshard was deferred at the pool's bound)",
                     u->name);
  return fsdp_stream_wait_event(compute, u->gathered);
}

void *fsdp_unit_params(fsdp_unit *u) { return u->cfg.zero == 3 ? (u->pslot >= 0 ? u->pbuf : NULL) : u->cfull; }

int fsdp_unit_reshard(fsdp_unit *u, fsdp_stream *compute) {
  if (u->cfg.zero != 3 || u->pslot < 0) return FSDP_OK;
  int rc = fsdp_pool_release(u->ppool, u->pslot, compute);
  u->pslot = -1;
  u->pbuf = NULL;
  return rc;
}

int fsdp_unit_param_view(fsdp_unit *u, int param, int which, int ndim, const int64_t *shape, fsdp_tensor *out) {
  if (!u || !out) return fsdp_fail(FSDP_EINVAL, "unit_param_view: NULL unit or out");
  FSDP_CHECK(fsdp_offload_settle(u));
  if (param < 0 || param >= u->np)
    return fsdp_fail(FSDP_EINVAL, "unit '%s': parameter %d does not exist (it has %d)", u->name, param, u->np);
  if (which != FSDP_VIEW_PARAM && which != FSDP_VIEW_GRAD)
    return fsdp_fail(FSDP_EINVAL, "unit '%s': view kind %d (expected FSDP_VIEW_PARAM or FSDP_VIEW_GRAD)", u->name, which);
  void *buf = which == FSDP_VIEW_PARAM ? fsdp_unit_params(u) : (u->cfg.zero <= 1 ? u->gfull : u->gbuf);
  if (!buf)
    return fsdp_fail(FSDP_ESTATE, "unit '%s': the full %s are not there (%s first)", u->name,
                     which == FSDP_VIEW_PARAM ? "params" : "grads",
                     which == FSDP_VIEW_PARAM ? "unshard and wait" : "take the grad buffer with fsdp_unit_grads");
  /* the whole flat buffer as a tensor, then the parameter's range of it */
  fsdp_tensor flat = {.data = buf, .dtype = u->cfg.compute_dtype, .device = u->dev, .ndim = 1, .owns = 0,
                      .shape = {u->T, 1, 1, 1}};
  int64_t numel = 1;
  for (int i = 0; shape && i < ndim && i < 4; i++) numel *= shape[i];
  if (shape && ndim >= 1 && ndim <= 4 && numel != u->numels[param])
    return fsdp_fail(FSDP_EINVAL, "unit '%s': parameter %d has %lld elements; the view's shape has %lld", u->name, param,
                     (long long)u->numels[param], (long long)numel);
  return fsdp_tensor_view(out, &flat, fsdp_layout_param_offset(u->layout, param), ndim, shape);
}

/* ---- backward: grads ---- */

int fsdp_unit_grads(fsdp_unit *u, fsdp_stream *compute, void **out) {
  FSDP_CHECK(fsdp_offload_settle(u));
  if (u->cfg.zero <= 1) {
    *out = u->gfull;
    return FSDP_OK;
  }
  if (u->gslot < 0) {
    int rc = fsdp_pool_acquire(u->gpool, (size_t)u->T * u->ces, compute, &u->gslot, &u->gbuf);
    if (rc == 1)
      return fsdp_fail(FSDP_ESTATE, "unit '%s': every grad buffer is in use (raise max_live_units, or reduce units "
                       "before taking more)", u->name);
    FSDP_CHECK(rc);
    FSDP_CHECK(fsdp_memset(u->gbuf, 0, (size_t)u->T * u->ces, compute));
  }
  *out = u->gbuf;
  return FSDP_OK;
}

/* reduce-scatter `full` into fp32 `dst`; accumulate adds instead of writing */
static int reduce_scatter_into(fsdp_unit *u, float *dst, const void *full, int accumulate) {
  fsdp_comm *c = u->red;
  int cd = u->cfg.compute_dtype, rd = u->cfg.reduce_dtype;
  if (!accumulate && rd == FSDP_FP32 && !u->offg) /* (not into host memory: through the scratch) */
    return fsdp_comm_reduce_scatter(c, dst, FSDP_FP32, full, cd, (size_t)u->S, u->cfg.grad_op);
  FSDP_CHECK(fsdp_comm_reduce_scatter(c, TMP(u), rd, full, cd, (size_t)u->S, u->cfg.grad_op));
  return enqueue_host(c->stream, accumulate ? 0 : 1, dst, TMP(u), rd, u->S);
}

int fsdp_unit_reduce(fsdp_unit *u, fsdp_stream *compute, int sync) {
  fsdp_comm *c = u->red;
  int z = u->cfg.zero;
  if (z <= 1 && !sync) return FSDP_OK; /* accumulate in the full grads */
  if (z >= 2 && u->gslot < 0) return fsdp_fail(FSDP_ESTATE, "unit '%s': reduce() without grads()", u->name);
  FSDP_CHECK(fsdp_offload_settle(u));
  FSDP_CHECK(fsdp_offload_before_reduce(u));
  if (u->zeroed) FSDP_CHECK(fsdp_stream_wait_event(c->stream, u->zeroed)); /* the last step's zeroing, on shard */
  FSDP_CHECK(fsdp_event_record(u->ready, compute));
  FSDP_CHECK(fsdp_stream_wait_event(c->stream, u->ready));
  FSDP_CHECK(enqueue_stamp(c->stream, &u->times.reduce_begin));
  size_t gbytes = (size_t)u->T * u->ces;
  if (z == 0) {
    if (u->cfg.reduce_dtype == FSDP_FP32) {
      FSDP_CHECK(enqueue_host(c->stream, 1, u->gmain, u->gfull, u->cfg.compute_dtype, u->T));
      FSDP_CHECK(fsdp_comm_all_reduce(c, u->gmain, u->gmain, (size_t)u->T, FSDP_FP32, u->cfg.grad_op));
    } else {
      FSDP_CHECK(fsdp_comm_all_reduce(c, u->gfull, u->gfull, (size_t)u->T, u->cfg.compute_dtype, u->cfg.grad_op));
      FSDP_CHECK(enqueue_host(c->stream, 1, u->gmain, u->gfull, u->cfg.compute_dtype, u->T));
    }
    FSDP_CHECK(enqueue_host(c->stream, 2, u->gfull, NULL, 0, (int64_t)gbytes));
  } else if (z == 1) {
    FSDP_CHECK(reduce_scatter_into(u, u->gacc, u->gfull, 0));
    FSDP_CHECK(enqueue_host(c->stream, 2, u->gfull, NULL, 0, (int64_t)gbytes));
  } else {
    /* every micro-batch: accumulation stays sharded, in fp32 */
    FSDP_CHECK(reduce_scatter_into(u, u->gacc, u->gbuf, 1));
    FSDP_CHECK(fsdp_pool_release(u->gpool, u->gslot, c->stream));
    u->gslot = -1;
    u->gbuf = NULL;
  }
  FSDP_CHECK(enqueue_stamp(c->stream, &u->times.reduce_end));
  if (sync && u->offg) return FSDP_OK; /* the grads are in host memory already */
  if (sync && u->off) { /* offload: agree across replicas on the device, then copy down for the host step */
    fsdp_stream *s = c->stream;
    if (u->outer) {
      FSDP_CHECK(fsdp_event_record(u->ready, c->stream));
      FSDP_CHECK(fsdp_stream_wait_event(u->outer->stream, u->ready));
      FSDP_CHECK(fsdp_comm_all_reduce(u->outer, u->gacc, u->gacc, (size_t)u->n_opt, FSDP_FP32, u->cfg.grad_op));
      s = u->outer->stream;
    }
    u->gstale = 0;
    if (u->dev == FSDP_CUDA) return fsdp_offload_grads_down(u, s); /* on the transfer stream */
    FSDP_CHECK(enqueue_host(s, 1, u->gmain, u->gacc, FSDP_FP32, u->n_opt));
    return enqueue_host(s, 2, u->gacc, NULL, 0, u->S * (int64_t)sizeof(float)); /* the next step accumulates from 0 */
  }
  if (sync && u->outer) { /* HSDP: the grad shards agree across replicas */
    FSDP_CHECK(fsdp_event_record(u->ready, c->stream));
    FSDP_CHECK(fsdp_stream_wait_event(u->outer->stream, u->ready));
    if (u->hf) { /* HFSDP: each replica keeps 1/R of the shard's grads */
      FSDP_CHECK(fsdp_comm_reduce_scatter(u->outer, u->gmain, FSDP_FP32, u->gacc, FSDP_FP32, (size_t)u->n_opt,
                                          u->cfg.grad_op));
      FSDP_CHECK(enqueue_host(u->outer->stream, 2, u->gacc, NULL, 0, u->S * (int64_t)sizeof(float)));
    } else {
      FSDP_CHECK(fsdp_comm_all_reduce(u->outer, u->gmain, u->gmain, (size_t)u->n_opt, FSDP_FP32, u->cfg.grad_op));
    }
  }
  return FSDP_OK;
}

int fsdp_unit_synchronize(fsdp_unit *u) {
  FSDP_CHECK(fsdp_offload_settle(u));
  FSDP_CHECK(fsdp_comm_synchronize(u->shard));
  if (u->red != u->shard) FSDP_CHECK(fsdp_comm_synchronize(u->red));
  if (u->outer) FSDP_CHECK(fsdp_comm_synchronize(u->outer));
  return fsdp_offload_synchronize(u);
}

/* ---- optimizer ---- */

/* the grads the optimizer reads, this rank's part of the norm: zero 0 holds
 * full grads everywhere, so only this rank's slice counts, and the sum over
 * the shard group is the total for every zero level */
static void norm_range(const fsdp_unit *u, const float **g, int64_t *n) {
  *g = u->cfg.zero == 0 ? u->gmain + (int64_t)u->r * u->S : u->gmain;
  *n = u->cfg.zero == 0 ? u->S : u->n_opt;
}

static int host_norm(void *arg) {
  fsdp_unit *u = arg;
  const float *g;
  int64_t n;
  norm_range(u, &g, &n);
  u->hstatus = fsdp_sum_squares(g, n, &u->hsum, &u->hbad);
  return u->hstatus;
}

/* the stream that writes the optimizer's grads last: the outer group's
 * when replicas reduce, else the shard group's */
static fsdp_stream *last_stream(const fsdp_unit *u) { return u->outer ? u->outer->stream : u->red->stream; }

int fsdp_unit_grad_norm_start(fsdp_unit *u) {
  if (!u) return fsdp_fail(FSDP_EINVAL, "unit_grad_norm_start: NULL unit");
  fsdp_stream *s = last_stream(u);
  if (u->dev == FSDP_CPU) { /* a task behind the reduction on the comm worker */
    u->hstatus = FSDP_OK;
    FSDP_CHECK(fsdp_cpu_stream_enqueue(s, host_norm, u, NULL));
    u->norm_pending = 1;
    return FSDP_OK;
  }
  if (u->off) return FSDP_OK; /* summed on the device before the grads go down (offload.c) */
  const float *g;
  int64_t n;
  norm_range(u, &g, &n);
  return fsdp_unit_norm_on_device(u, g, n, s);
}

int fsdp_unit_norm_on_device(fsdp_unit *u, const float *g, int64_t n, fsdp_stream *s) {
  FSDP_CHECK(fsdp_memset(u->sums, 0, 16, s));
  FSDP_CHECK(fsdp_cuda()->sum_squares(g, n, (double *)u->sums, (int64_t *)u->sums + 1, s));
  u->norm_pending = 1;
  return FSDP_OK;
}

int fsdp_unit_grad_norm_get(fsdp_unit *u, double *sum, int64_t *nonfinite) {
  if (!u || !sum || !nonfinite) return fsdp_fail(FSDP_EINVAL, "unit_grad_norm_get: NULL argument");
  FSDP_CHECK(fsdp_unit_synchronize(u));
  int pending = u->norm_pending;
  u->norm_pending = 0;
  if (u->dev == FSDP_CPU && pending) {
    *sum = u->hsum;
    *nonfinite = u->hbad;
    return u->hstatus;
  }
  if (u->dev == FSDP_CPU || (u->off && !pending)) {
    const float *g;
    int64_t n;
    norm_range(u, &g, &n);
    return fsdp_sum_squares(g, n, sum, nonfinite);
  }
  if (!pending) FSDP_CHECK(fsdp_unit_grad_norm_start(u)); /* not offloaded here */
  u->norm_pending = 0;
  /* the kernel ran on a comm stream, which the default stream does not wait for */
  FSDP_CHECK(fsdp_stream_synchronize(last_stream(u)));
  FSDP_CHECK(fsdp_memcpy(sum, u->sums, sizeof(double), NULL));
  return fsdp_memcpy(nonfinite, (char *)u->sums + 8, sizeof(int64_t), NULL);
}

int fsdp_unit_grad_sumsq(fsdp_unit *u, double *sum, int64_t *nonfinite) {
  return fsdp_unit_grad_norm_get(u, sum, nonfinite); /* started or not */
}

static int zero_main_grads(fsdp_unit *u) {
  size_t bytes = (size_t)u->n_opt * sizeof(float);
  if (u->dev == FSDP_CUDA && !u->off) { /* behind the optimizer's kernels on the shard stream */
    FSDP_CHECK(fsdp_memset(u->gmain, 0, bytes, u->shard->stream));
    return u->zeroed ? fsdp_event_record(u->zeroed, u->shard->stream) : FSDP_OK;
  }
  memset(u->gmain, 0, bytes);
  return FSDP_OK;
}

int fsdp_unit_zero_grad(fsdp_unit *u) {
  FSDP_CHECK(fsdp_unit_synchronize(u));
  return zero_main_grads(u);
}

/* the compute-dtype output of an update (fsdp_step_args.stage): the CPU
 * loops write bf16 (fp32 is copied after them), the CUDA kernels either */
static uint16_t *stage_bf16(const fsdp_unit *u, const fsdp_step_args *a, int64_t off) {
  return a->stage && u->cfg.compute_dtype == FSDP_BF16 ? (uint16_t *)a->stage + off : NULL;
}
static void *stage_at(const fsdp_unit *u, const fsdp_step_args *a, int64_t off) {
  return a->stage ? (char *)a->stage + (size_t)off * u->ces : NULL;
}

static int adamw_update(fsdp_unit *u, const fsdp_step_args *a, int64_t off, int64_t len, int param) {
  fsdp_adamw_config c = *a->adamw;
  if (u->no_decay[param]) c.weight_decay = 0;
  if (u->dev == FSDP_CUDA && !u->off)
    return fsdp_cuda()->adamw_step(u->main + off, stage_at(u, a, off), u->cfg.compute_dtype, u->gmain + off,
                                   u->m + off, u->v + off, len, a->step, &c, a->grad_scale, u->shard->stream);
  return fsdp_adamw_step(u->main + off, stage_bf16(u, a, off), u->gmain + off, u->m + off, u->v + off, len, a->step,
                         &c, a->grad_scale);
}

static int sgd_update(fsdp_unit *u, const fsdp_step_args *a, int64_t off, int64_t len, int param) {
  float wd = u->no_decay[param] ? 0.0f : a->weight_decay;
  if (u->dev == FSDP_CUDA && !u->off)
    return fsdp_cuda()->sgd_step(u->main + off, stage_at(u, a, off), u->cfg.compute_dtype, u->gmain + off, u->m + off,
                                 len, a->step, a->lr, a->momentum, wd, a->grad_scale, u->shard->stream);
  return fsdp_sgd_step(u->main + off, stage_bf16(u, a, off), u->gmain + off, u->m + off, len, a->step, a->lr,
                       a->momentum, wd, a->grad_scale);
}

/* The compute-dtype params from the fp32 main params: after an optimizer
 * step, or after a checkpoint load set the main params. Zero 0 casts the
 * full copy; zero >= 1 casts the shard (HFSDP: all-gathers the replicas'
 * ranges into it) and, for the resident levels, all-gathers the full
 * params. */
static int publish(fsdp_unit *u, int cast) {
  if (u->cfg.zero == 0) {
    if (cast) FSDP_CHECK(cast_out(u->cfull, u->cfg.compute_dtype, u->main, u->T, u->shard->stream));
    /* the compute stream reads cfull after this event (fsdp_unit_wait) */
    return fsdp_event_record(u->gathered, u->shard->stream);
  }
  if (u->hf) { /* gather the replicas' ranges into the compute shard */
    FSDP_CHECK(cast_out(TMP(u), u->cfg.compute_dtype, u->main, u->n_opt, u->shard->stream));
    if (u->dev == FSDP_CUDA) FSDP_CHECK(fsdp_stream_synchronize(u->shard->stream));
    FSDP_CHECK(fsdp_comm_all_gather(u->outer, u->cshard, TMP(u), (size_t)u->n_opt, u->cfg.compute_dtype));
    FSDP_CHECK(fsdp_comm_synchronize(u->outer));
  } else if (u->hstage) { /* offload on a GPU: cast on the host, one copy up (offp: up at each unshard) */
    FSDP_CHECK(cast_out(u->hstage, u->cfg.compute_dtype, u->main, u->S, NULL));
    if (!u->offp) FSDP_CHECK(fsdp_memcpy(u->cshard, u->hstage, (size_t)u->S * u->ces, u->shard->stream));
  } else if (cast) {
    FSDP_CHECK(cast_out(u->cshard, u->cfg.compute_dtype, u->main, u->S, u->shard->stream));
  }
  if (u->cfg.zero <= 2) { /* resident full params: gather the new values */
    FSDP_CHECK(fsdp_comm_all_gather(u->shard, u->cfull, u->cshard, (size_t)u->S, u->cfg.compute_dtype));
    FSDP_CHECK(fsdp_event_record(u->gathered, u->shard->stream));
  }
  return FSDP_OK;
}

int fsdp_unit_publish_params(fsdp_unit *u) { return publish(u, !u->alias); }

/* Where the in-place step writes the new compute params as it updates
 * (zero 0: the full copy; else the compute shard); NULL where the publish
 * casts instead (HFSDP gathers the replicas' ranges) or nothing is to be
 * written (fp32 alias). */
static void *inplace_stage(const fsdp_unit *u) {
  if (u->alias || u->hf) return NULL;
  return u->cfg.zero == 0 ? u->cfull : u->cshard;
}

/* Update what this rank owns (zero 0: everything), write the new values back
 * to the compute params, and zero the grads. */
int fsdp_unit_update_pieces(fsdp_unit *u, fsdp_update_fn update, const fsdp_step_args *a, const fsdp_layout_piece *ps,
                            int k) {
  /* bf16, and CUDA kernels: the update writes the stage itself */
  int copy = a->stage && u->cfg.compute_dtype == FSDP_FP32 && (u->dev == FSDP_CPU || u->off);
  for (int j = 0; j < k; j++) {
    int64_t off = ps[j].shard_offset, len = ps[j].end - ps[j].begin;
    FSDP_CHECK(update(u, a, off, len, ps[j].param));
    if (copy) memcpy((float *)a->stage + off, u->main + off, (size_t)len * sizeof(float));
  }
  return FSDP_OK;
}

static int step_owned(fsdp_unit *u, fsdp_update_fn update, const fsdp_step_args *a) {
  FSDP_CHECK(fsdp_unit_synchronize(u));
  /* the element ranges this rank's optimizer holds (unit_state.c): every
   * parameter at zero 0, else its shard's pieces in the optimizer's range */
  int k = fsdp_unit_state_pieces(u, 0, NULL, 0);
  FSDP_CHECK(k);
  fsdp_layout_piece *ps = malloc(sizeof *ps * (size_t)(k ? k : 1));
  if (!ps) return fsdp_fail(FSDP_ENOMEM, "unit '%s': out of memory", u->name);
  fsdp_unit_state_pieces(u, 0, ps, k);
  if (u->off) return fsdp_offload_step(u, update, a, ps, k); /* returns at once (offload.c) */
  fsdp_step_args in_place = *a;
  in_place.stage = inplace_stage(u);
  int rc = fsdp_unit_update_pieces(u, update, &in_place, ps, k);
  free(ps);
  FSDP_CHECK(rc);
  FSDP_CHECK(publish(u, 0)); /* the update wrote the compute params, or they are main (HFSDP still gathers) */
  return zero_main_grads(u);
}

int fsdp_unit_step(fsdp_unit *u, int64_t step, const fsdp_adamw_config *cfg, float grad_scale) {
  if (!u || !cfg) return fsdp_fail(FSDP_EINVAL, "unit_step: NULL argument");
  FSDP_CHECK(fsdp_adamw_step(NULL, NULL, NULL, NULL, NULL, 0, step, cfg, grad_scale)); /* the arguments, here */
  fsdp_step_args a = {step, grad_scale, cfg, 0, 0, 0, NULL};
  return step_owned(u, adamw_update, &a);
}

int fsdp_unit_step_sgd(fsdp_unit *u, int64_t step, float lr, float momentum, float weight_decay, float grad_scale) {
  if (!u) return fsdp_fail(FSDP_EINVAL, "unit_step_sgd: NULL unit");
  FSDP_CHECK(fsdp_sgd_step(NULL, NULL, NULL, NULL, 0, step, lr, momentum, weight_decay, grad_scale));
  fsdp_step_args a = {step, grad_scale, NULL, lr, momentum, weight_decay, NULL};
  return step_owned(u, sgd_update, &a);
}

int fsdp_unit_memory_info(const fsdp_unit *u, fsdp_unit_memory *out) {
  if (!u || !out) return fsdp_fail(FSDP_EINVAL, "unit_memory_info: NULL argument");
  int64_t c = (int64_t)u->ces, f = (int64_t)sizeof(float);
  *out = (fsdp_unit_memory){
      .params_full = u->cfull && u->cfull != (void *)u->main ? u->T * c : 0,
      .params_shard = u->cshard && u->cshard != (void *)u->main ? u->S * c : 0,
      .main_params = u->n_opt * f,
      .optimizer = 2 * u->n_opt * f,
      .grads_full = u->gfull ? u->T * c : 0,
      .grads_main = u->n_opt * f + (u->gacc != u->gmain ? u->S * f : 0),
      .scratch = 0, /* shared by the group's units: fsdp_comm_scratch_bytes */
      .shard_numel = u->S,
      .total_numel = u->T,
      .offloaded = u->off ? 4 * u->n_opt * f + (u->hstage ? u->S * c : 0) : 0,
  };
  return FSDP_OK;
}
