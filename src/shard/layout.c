/* layout.c: where a unit's parameters live in its flat buffer, and which
 * rank owns what. Pure arithmetic, no memory beyond the offsets.
 *
 * Parameters are packed in order, each starting at a multiple of
 * param_align elements; the buffer is padded to W equal shards of S
 * elements, S the smallest multiple of shard_align that covers the packed
 * size. Rank r owns elements [r*S, (r+1)*S): one contiguous, aligned slice,
 * so the all-gather writes it straight into the full buffer and the
 * reduce-scatter reads the grad buffer in place. A parameter may span shards
 * or be absent from a rank. */
#include <stdlib.h>

#include "../base/error.h"
#include "../fsdp_shard.h"

struct fsdp_layout {
  int nparams, group_size;
  int64_t param_align, shard_align, used, packed, shard;
  int64_t *numel, *offset;
};

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

int fsdp_layout_create(int nparams, const int64_t *numels, int group_size, int64_t param_align, int64_t shard_align,
                       fsdp_layout **out) {
  if (!out) return fsdp_fail(FSDP_EINVAL, "layout: NULL out");
  *out = NULL;
  if (nparams < 0 || (nparams && !numels)) return fsdp_fail(FSDP_EINVAL, "layout: bad parameter list");
  if (group_size < 1) return fsdp_fail(FSDP_EINVAL, "layout: group size %d; expected >= 1", group_size);
  if (param_align < 1 || shard_align < 1)
    return fsdp_fail(FSDP_EINVAL, "layout: alignments must be >= 1 (param %lld, shard %lld)", (long long)param_align,
                     (long long)shard_align);
  fsdp_layout *l = calloc(1, sizeof *l);
  if (!l) return fsdp_fail(FSDP_ENOMEM, "layout: out of memory");
  l->numel = malloc(sizeof(int64_t) * (size_t)(nparams ? nparams : 1));
  l->offset = malloc(sizeof(int64_t) * (size_t)(nparams ? nparams : 1));
  if (!l->numel || !l->offset) {
    fsdp_layout_destroy(l);
    return fsdp_fail(FSDP_ENOMEM, "layout: out of memory");
  }
  l->nparams = nparams;
  l->group_size = group_size;
  l->param_align = param_align;
  l->shard_align = shard_align;
  int64_t at = 0;
  for (int i = 0; i < nparams; i++) {
    if (numels[i] < 0 || numels[i] > ((int64_t)1 << 50)) {
      int rc = fsdp_fail(FSDP_EINVAL, "layout: parameter %d has %lld elements", i, (long long)numels[i]);
      fsdp_layout_destroy(l);
      return rc;
    }
    at = round_up(at, param_align);
    l->offset[i] = at;
    l->numel[i] = numels[i];
    at += numels[i];
    l->used += numels[i];
  }
  l->packed = at;
  l->shard = round_up((at + group_size - 1) / group_size, shard_align);
  *out = l;
  return FSDP_OK;
}

int fsdp_layout_destroy(fsdp_layout *l) {
  if (!l) return FSDP_OK;
  free(l->numel);
  free(l->offset);
  free(l);
  return FSDP_OK;
}

int64_t fsdp_layout_numel_used(const fsdp_layout *l) { return l ? l->used : FSDP_EINVAL; }
int64_t fsdp_layout_numel_total(const fsdp_layout *l) { return l ? l->shard * l->group_size : FSDP_EINVAL; }
int64_t fsdp_layout_shard_numel(const fsdp_layout *l) { return l ? l->shard : FSDP_EINVAL; }

int fsdp_layout_group_size(const fsdp_layout *l) { return l ? l->group_size : 0; }

int64_t fsdp_layout_param_offset(const fsdp_layout *l, int param) {
  if (!l || param < 0 || param >= l->nparams)
    return fsdp_fail(FSDP_EINVAL, "layout: no parameter %d (%d in the unit)", param, l ? l->nparams : 0);
  return l->offset[param];
}

int fsdp_layout_rank_pieces(const fsdp_layout *l, int rank, fsdp_layout_piece *out, int cap) {
  if (!l || rank < 0 || rank >= l->group_size)
    return fsdp_fail(FSDP_EINVAL, "layout: rank %d out of range [0, %d)", rank, l ? l->group_size : 0);
  if (cap > 0 && !out) return fsdp_fail(FSDP_EINVAL, "layout: NULL piece array");
  int64_t lo = (int64_t)rank * l->shard, hi = lo + l->shard;
  int n = 0;
  for (int i = 0; i < l->nparams; i++) {
    int64_t b = l->offset[i], e = b + l->numel[i];
    if (e <= lo || b >= hi || b == e) continue;
    if (n < cap) {
      int64_t pb = b > lo ? b : lo, pe = e < hi ? e : hi;
      out[n] = (fsdp_layout_piece){.param = i, .rank = rank, .begin = pb - b, .end = pe - b, .shard_offset = pb - lo};
    }
    n++;
  }
  return n; /* may exceed cap: call again with room for n */
}

int fsdp_layout_owner(const fsdp_layout *l, int param, int64_t index, fsdp_layout_piece *out) {
  if (!l || !out) return fsdp_fail(FSDP_EINVAL, "layout_owner: NULL argument");
  if (param < 0 || param >= l->nparams)
    return fsdp_fail(FSDP_EINVAL, "layout: no parameter %d (%d in the unit)", param, l->nparams);
  if (index < 0 || index >= l->numel[param])
    return fsdp_fail(FSDP_EINVAL, "layout: element %lld of parameter %d is outside [0, %lld)", (long long)index, param,
                     (long long)l->numel[param]);
  int64_t flat = l->offset[param] + index;
  int rank = (int)(flat / l->shard);
  *out = (fsdp_layout_piece){
      .param = param, .rank = rank, .begin = index, .end = index + 1, .shard_offset = flat - (int64_t)rank * l->shard};
  return FSDP_OK;
}
