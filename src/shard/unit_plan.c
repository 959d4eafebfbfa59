/* unit_plan.c: which buffers an FSDP unit holds, where, and how big: a pure
 * function of its config, its layout and where it runs. The one place this
 * is decided: fsdp_unit_create allocates the rows, fsdp_unit_memory_info
 * sums them, and the planner (lua/fsdp/planner.lua) calls this for units
 * that do not exist, so a plan and a live unit cannot disagree.
 *
 *   zero | full params      | full grads       | fp32 main params, optimizer, main grads
 *   0    | resident         | resident         | all T (every rank the same)
 *   1    | resident         | resident         | the shard
 *   2    | resident         | pool, backward   | the shard
 *   3    | pool, gathered   | pool, backward   | the shard
 *
 * Variants: HFSDP keeps 1/R of the shard's optimizer range (an fp32 grad
 * accumulator for the whole shard besides); offload keeps the optimizer's
 * rows in host memory (and an fp32 grad accumulator on the device, unless
 * the grads are offloaded too, and a host staging shard on GPUs); params on
 * the host (GPUs, zero 3) keep no device param shard. fp32 compute in place
 * (no offload, no HFSDP, no registration) uses the main params as the
 * compute params; bf16 compute in place (no offload, no HFSDP) keeps only
 * the low 16 bits of each fp32 main param, the compute params being the
 * high ones (2 bytes per element instead of 4). A shard group of one rank
 * (one GPU) gathers nothing: the shard is the full unit. */
#include <string.h>

#include "../base/error.h"
#include "../fsdp_shard.h"

static const char *const names[FSDP_UBUF_COUNT] = {"main_params", "opt1",        "opt2",        "main_grads", "grad_accum",
                                                   "param_shard", "params_full", "grads_full", "host_stage",  "grads_sum"};

/* the public struct spells the row count out (FFI-clean) */
_Static_assert(sizeof(((fsdp_unit_plan *)0)->rows) / sizeof(fsdp_unit_buffer_row) == FSDP_UBUF_COUNT,
               "fsdp_unit_plan.rows has one row per fsdp_unit_buffer");

const char *fsdp_unit_buffer_name(int buffer) {
  return buffer >= 0 && buffer < FSDP_UBUF_COUNT ? names[buffer] : NULL;
}

static void hold(fsdp_unit_plan *p, int row, int held, int64_t bytes, int comm) {
  p->rows[row] = (fsdp_unit_buffer_row){.held = held, .alias_of = -1, .comm = comm, .bytes = bytes};
}

static void alias(fsdp_unit_plan *p, int row, int of, int comm) {
  p->rows[row] = (fsdp_unit_buffer_row){.held = FSDP_HELD_ALIAS, .alias_of = of, .comm = comm, .bytes = 0};
}

/* The config's rules, the same for a unit made and a unit planned (so that
 * `fsdp plan` never shows a plan that creation refuses). outer_ranks: the
 * HSDP replicas (1: none). */
int fsdp_unit_config_check(const fsdp_unit_config *c, int outer_ranks) {
  if (c->zero < 0 || c->zero > 3) return fsdp_fail(FSDP_EINVAL, "zero = %d; expected 0, 1, 2 or 3", c->zero);
  if (c->compute_dtype != FSDP_FP32 && c->compute_dtype != FSDP_BF16)
    return fsdp_fail(FSDP_EINVAL, "compute dtype must be fp32 or bf16");
  if (c->reduce_dtype != FSDP_FP32 && c->reduce_dtype != c->compute_dtype)
    return fsdp_fail(FSDP_EINVAL, "reduce dtype must be fp32 or the compute dtype");
  if (c->grad_op != FSDP_AVG && c->grad_op != FSDP_SUM) return fsdp_fail(FSDP_EINVAL, "grad_op must be avg or sum");
  if (c->comm_register < FSDP_REG_NONE || c->comm_register > FSDP_REG_WINDOW)
    return fsdp_fail(FSDP_EINVAL, "comm_register = %d; expected 0 (none), 1 (buffers) or 2 (windows)", c->comm_register);
  if (c->offload < 0 || c->offload > 7)
    return fsdp_fail(FSDP_EINVAL, "offload = %d; expected fsdp_offload_bits (0..7)", c->offload);
  if (c->offload && (c->zero == 0 || c->hfsdp))
    return fsdp_fail(FSDP_EINVAL, "offload needs zero >= 1 and no hfsdp (zero %d%s)", c->zero, c->hfsdp ? ", hfsdp" : "");
  if ((c->offload & FSDP_OFFLOAD_PARAMS) && c->zero != 3)
    return fsdp_fail(FSDP_EINVAL, "offloading the params (offload = {params = true}) needs zero 3 (zero %d): the resident "
                     "levels keep the full params on the device anyway", c->zero);
  if ((c->offload & FSDP_OFFLOAD_GRADS) && outer_ranks > 1)
    return fsdp_fail(FSDP_EINVAL, "offloading the grads needs no outer (HSDP) group: replicas agree on the device before "
                     "the grads go down");
  if (c->hfsdp && c->zero == 0)
    return fsdp_fail(FSDP_EINVAL, "hfsdp shards the optimizer over the outer group: it needs zero >= 1 (zero 0)");
  if (c->overlap_step != 0 && c->overlap_step != 1)
    return fsdp_fail(FSDP_EINVAL, "overlap_step = %d; expected 0 or 1", c->overlap_step);
  if (c->overlap_step && (c->offload || c->hfsdp))
    return fsdp_fail(FSDP_EINVAL, "overlap_step defers the step to the unit's next use: not with %s",
                     c->offload ? "offload (an offloaded step overlaps on the host already)"
                                : "hfsdp (its publish gathers over the outer group at once)");
  if (c->micro_batches < 0)
    return fsdp_fail(FSDP_EINVAL, "micro_batches = %d; expected 0 (any) or the fixed count per step", c->micro_batches);
  return FSDP_OK;
}

int fsdp_unit_plan_make(const fsdp_unit_config *cfg, const fsdp_layout *layout, int device, int outer_ranks,
                        int outer_rank, fsdp_unit_plan *out) {
  if (!cfg || !layout || !out) return fsdp_fail(FSDP_EINVAL, "unit_plan_make: NULL argument");
  if (device != FSDP_CPU && device != FSDP_CUDA) return fsdp_fail(FSDP_EINVAL, "unit_plan_make: device %d", device);
  if (outer_ranks < 1 || outer_rank < 0 || outer_rank >= outer_ranks)
    return fsdp_fail(FSDP_EINVAL, "unit_plan_make: outer rank %d of %d", outer_rank, outer_ranks);
  FSDP_CHECK(fsdp_unit_config_check(cfg, outer_ranks));
  int z = cfg->zero, gpu = device == FSDP_CUDA, hf = cfg->hfsdp != 0, off = cfg->offload != 0;
  int params_on_host = gpu && (cfg->offload & FSDP_OFFLOAD_PARAMS);
  int grads_on_host = (cfg->offload & FSDP_OFFLOAD_GRADS) != 0;
  int64_t S = fsdp_layout_shard_numel(layout), c = (int64_t)fsdp_dtype_size(cfg->compute_dtype), f = 4;
  int R = hf ? outer_ranks : 1;
  fsdp_unit_plan p;
  memset(&p, 0, sizeof p);
  p.shard_numel = S;
  p.total_numel = fsdp_layout_numel_total(layout);
  p.opt_numel = z == 0 ? p.total_numel : S / R;
  p.opt_offset = hf ? (int64_t)outer_rank * p.opt_numel : 0;
  for (int i = 0; i < FSDP_UBUF_COUNT; i++) hold(&p, i, FSDP_HELD_NOT, 0, 0);

  /* the optimizer's rows: on the device, or in host memory when offloaded
   * (on CPU ranks the same memory, counted as offloaded all the same) */
  int opt_where = off ? FSDP_HELD_HOST : FSDP_HELD_DEVICE;
  for (int i = FSDP_UBUF_MAIN_PARAMS; i <= FSDP_UBUF_MAIN_GRADS; i++) hold(&p, i, opt_where, p.opt_numel * f, 0);
  /* split: the step reads and writes the compute params as the high
   * halves, which needs them to cover the optimizer's range (no HFSDP) and
   * to sit beside it (no offload) */
  p.main_split = cfg->compute_dtype == FSDP_BF16 && !off && !hf;
  if (p.main_split) p.rows[FSDP_UBUF_MAIN_PARAMS].bytes = p.opt_numel * 2;
  /* the grads accumulate on the device: HFSDP then reduce-scatters them
   * over the replicas, offload copies them down after the last micro-batch */
  if (hf || (off && !grads_on_host)) hold(&p, FSDP_UBUF_GRAD_ACCUM, FSDP_HELD_DEVICE, S * f, 0);
  if (off && gpu) hold(&p, FSDP_UBUF_HOST_STAGE, FSDP_HELD_HOST, S * c, 0);
  /* compact grads: a single backward's bf16 grads, reduced into bf16 (or
   * not at all) are already what the optimizer reads; widening them to
   * fp32 adds no information. Not with replicas (their sum is fp32) */
  int alone = fsdp_layout_group_size(layout) == 1;
  p.grads_compact = cfg->compute_dtype == FSDP_BF16 && cfg->micro_batches == 1 && !off && !hf && outer_ranks == 1 &&
                    (alone || cfg->reduce_dtype == FSDP_BF16);
  if (p.grads_compact) p.rows[FSDP_UBUF_MAIN_GRADS].bytes = p.opt_numel * c;

  /* the compute params: the main params themselves for fp32 in place */
  p.compute_is_main = cfg->compute_dtype == FSDP_FP32 && !off && !hf && !cfg->comm_register;
  if (z >= 1 && p.compute_is_main) alias(&p, FSDP_UBUF_PARAM_SHARD, FSDP_UBUF_MAIN_PARAMS, 1);
  else if (z >= 1 && !params_on_host) hold(&p, FSDP_UBUF_PARAM_SHARD, FSDP_HELD_DEVICE, S * c, 1);
  if (z == 0 && p.compute_is_main) alias(&p, FSDP_UBUF_PARAMS_FULL, FSDP_UBUF_MAIN_PARAMS, 1);
  else if (z <= 2) hold(&p, FSDP_UBUF_PARAMS_FULL, FSDP_HELD_DEVICE, p.total_numel * c, 1);
  if (z <= 1) hold(&p, FSDP_UBUF_GRADS_FULL, FSDP_HELD_DEVICE, p.total_numel * c, 1);
  /* compact, and the full grads are the optimizer's already: zero 0
   * reduces them in place, zero 1 alone has nothing to scatter */
  if (p.grads_compact && (z == 0 || (z == 1 && alone))) alias(&p, FSDP_UBUF_MAIN_GRADS, FSDP_UBUF_GRADS_FULL, 1);
  /* several bf16 micro-batches at zero 0-1 add up in fp32, not in the bf16
   * full grads: zero 0 in its full fp32 main grads, zero 1 in a full fp32
   * sum (4 bytes a param more; what Megatron's and DeepSpeed's ZeRO-1 hold) */
  p.sums_fp32 = z <= 1 && cfg->compute_dtype == FSDP_BF16 && cfg->reduce_dtype == FSDP_FP32 && cfg->micro_batches != 1;
  if (p.sums_fp32 && z == 1) hold(&p, FSDP_UBUF_GRADS_SUM, FSDP_HELD_DEVICE, p.total_numel * f, 0);

  /* shared and transient. One rank in the shard group holds the whole
   * unit: the shard is the full params (no gather, no param buffer, unless
   * it lives on the host), and a reduction only adds the full grads into
   * the fp32 ones (no staging, except for HFSDP's publish) */
  p.reduce_scratch = (alone && !hf) || p.grads_compact ? 0 : (S ? S : 1) * f;
  p.gather_stage = params_on_host ? (S ? S : 1) * c : 0;
  p.norm_sums = gpu ? 16 : 0;
  /* NCCL reduces in its input type: a bf16 reduce-scatter into fp32 goes
   * through an fp32 block, chunk by chunk (src/dist/comm_cast_chunks.c),
   * kept by the device's stream-ordered pool. Zero 1-3 reduce-scatter the
   * bf16 grads into the fp32 shard, unless the grads stay bf16 (compact) or
   * zero 1 reduces its fp32 sum */
  int ranks = fsdp_layout_group_size(layout);
  int casts = gpu && ranks > 1 && z >= 1 && cfg->compute_dtype == FSDP_BF16 && cfg->reduce_dtype == FSDP_FP32 &&
              !p.grads_compact && (z >= 2 || !p.sums_fp32);
  p.cast_stage = casts ? 4 * (int64_t)ranks * (int64_t)fsdp_comm_cast_chunk((size_t)S, ranks) : 0;
  p.pool_params = z == 3 && (!alone || params_on_host) ? p.total_numel * c : 0;
  /* compact and alone: the backward writes the optimizer's grads directly */
  p.pool_grads = z >= 2 && !(p.grads_compact && alone) ? p.total_numel * c : 0;
  *out = p;
  return FSDP_OK;
}
