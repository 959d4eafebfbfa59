/* meta_init.c: materialise only this rank's shard of a unit. Every element's
 * value is a pure function of (seed, parameter name, element index), drawn
 * with Philox, so the full model is identical bit for bit for any world
 * size, strategy and unit grouping, and no rank ever holds more than its
 * shard. Padding is zero. */
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "../fsdp_shard.h"

static int fill_run(void *dst, int dtype, int64_t n, uint64_t seed, const char *name, int64_t first,
                    const fsdp_init_rule *rule) {
  switch (rule->kind) {
    case FSDP_INIT_NORMAL:
      return fsdp_rng_fill(dst, dtype, n, seed, fsdp_rng_stream_id(name), first, FSDP_RNG_NORMAL, rule->a, rule->b);
    case FSDP_INIT_UNIFORM:
      return fsdp_rng_fill(dst, dtype, n, seed, fsdp_rng_stream_id(name), first, FSDP_RNG_UNIFORM, rule->a, rule->b);
    case FSDP_INIT_CONSTANT: {
      size_t es = fsdp_dtype_size(dtype);
      for (int64_t i = 0; i < n; i++) FSDP_CHECK(fsdp_convert((char *)dst + (size_t)i * es, dtype, &rule->a, FSDP_FP64, 1));
      return FSDP_OK;
    }
    default:
      return fsdp_fail(FSDP_EINVAL, "init of '%s': unknown rule %d (expected normal, uniform or constant)", name,
                       rule->kind);
  }
}

/* elements [first, first + n) of the parameter; a slice's go by runs
 * within one of its rows, each at the full parameter's index */
static int fill_piece(void *dst, int dtype, int64_t n, uint64_t seed, const char *name, int64_t first,
                      const fsdp_init_rule *rule) {
  if (rule->cols <= 0) return fill_run(dst, dtype, n, seed, name, first, rule);
  if (rule->gcols < rule->cols + rule->col0 || rule->row0 < 0 || rule->col0 < 0)
    return fsdp_fail(FSDP_EINVAL, "init of '%s': slice of %lld columns at (%lld, %lld) does not fit %lld columns", name,
                     (long long)rule->cols, (long long)rule->row0, (long long)rule->col0, (long long)rule->gcols);
  size_t es = fsdp_dtype_size(dtype);
  for (int64_t i = first; i < first + n;) {
    int64_t row = i / rule->cols, col = i % rule->cols;
    int64_t run = rule->cols - col < first + n - i ? rule->cols - col : first + n - i;
    FSDP_CHECK(fill_run((char *)dst + (size_t)(i - first) * es, dtype, run, seed, name,
                        (row + rule->row0) * rule->gcols + col + rule->col0, rule));
    i += run;
  }
  return FSDP_OK;
}

int fsdp_layout_init_shard(const fsdp_layout *l, int rank, const char *const *param_names,
                           const fsdp_init_rule *rules, uint64_t seed, void *shard, fsdp_dtype dtype) {
  if (!l || !param_names || !rules || !shard) return fsdp_fail(FSDP_EINVAL, "init_shard: NULL argument");
  size_t es = fsdp_dtype_size(dtype);
  if (!es) return fsdp_fail(FSDP_EINVAL, "init_shard: unknown dtype %d", dtype);
  int n = fsdp_layout_rank_pieces(l, rank, NULL, 0);
  if (n < 0) return n;
  fsdp_layout_piece *pieces = malloc(sizeof *pieces * (size_t)(n ? n : 1));
  if (!pieces) return fsdp_fail(FSDP_ENOMEM, "init_shard: out of memory");
  fsdp_layout_rank_pieces(l, rank, pieces, n);
  memset(shard, 0, (size_t)fsdp_layout_shard_numel(l) * es);
  int rc = FSDP_OK;
  for (int k = 0; k < n && rc == FSDP_OK; k++) {
    const fsdp_layout_piece *p = &pieces[k];
    const char *name = param_names[p->param];
    if (!name) {
      rc = fsdp_fail(FSDP_EINVAL, "init_shard: parameter %d has no name", p->param);
      break;
    }
    rc = fill_piece((char *)shard + (size_t)p->shard_offset * es, dtype, p->end - p->begin, seed, name, p->begin,
                    &rules[p->param]);
  }
  free(pieces);
  return rc;
}
