/* unit_state.c: a unit's training state as checkpoints see it: the fp32
 * main params and the optimizer's two arrays (AdamW's exp_avg and
 * exp_avg_sq; SGD's momentum in the first), addressed by parameter element
 * ranges, independent of world size, ZeRO level and unit grouping.
 *
 * A rank holds the pieces of its shard inside the optimizer's range (zero
 * 0: every parameter whole). It saves a disjoint part of them, so that each
 * element is written once across the job: its own layout pieces at zero 0,
 * nothing on HSDP replicas other than the first (they hold the same
 * values), its 1/R range with HFSDP. */
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "unit_impl.h"

/* append piece (param, begin, end at optimizer offset off) when to != NULL
 * and there is room; count it either way */
static void put(fsdp_layout_piece *out, int cap, int *k, int param, int rank, int64_t begin, int64_t end, int64_t off) {
  if (out && *k < cap) out[*k] = (fsdp_layout_piece){param, rank, begin, end, off};
  (*k)++;
}

int fsdp_unit_state_pieces(const fsdp_unit *u, int to_save, fsdp_layout_piece *out, int cap) {
  if (!u) return fsdp_fail(FSDP_EINVAL, "unit_state_pieces: NULL unit");
  const fsdp_layout *l = u->layout;
  int k = 0;
  if (to_save && u->outer && !u->hf && u->outer->rank != 0) return 0; /* a replica: the first one saves */
  if (u->cfg.zero == 0 && !to_save) {
    for (int p = 0; p < u->np; p++) put(out, cap, &k, p, u->r, 0, u->numels[p], fsdp_layout_param_offset(l, p));
    return k;
  }
  int n = fsdp_layout_rank_pieces(l, u->r, NULL, 0);
  fsdp_layout_piece *ps = malloc(sizeof *ps * (size_t)(n ? n : 1));
  if (!ps) return fsdp_fail(FSDP_ENOMEM, "unit '%s': out of memory", u->name);
  fsdp_layout_rank_pieces(l, u->r, ps, n);
  for (int j = 0; j < n; j++) {
    if (u->cfg.zero == 0) { /* the full copy: this rank's slice of it */
      put(out, cap, &k, ps[j].param, u->r, ps[j].begin, ps[j].end, (int64_t)u->r * u->S + ps[j].shard_offset);
      continue;
    }
    int64_t lo = ps[j].shard_offset, hi = lo + (ps[j].end - ps[j].begin); /* clipped to the optimizer's range */
    if (lo < u->sub) lo = u->sub;
    if (hi > u->sub + u->n_opt) hi = u->sub + u->n_opt;
    if (lo < hi) put(out, cap, &k, ps[j].param, u->r, ps[j].begin + (lo - ps[j].shard_offset),
                     ps[j].begin + (hi - ps[j].shard_offset), lo - u->sub);
  }
  free(ps);
  return k;
}

int64_t fsdp_unit_state_numel(const fsdp_unit *u) { return u ? u->n_opt : 0; }

static int state_buffer(fsdp_unit *u, int kind, int64_t off, int64_t n, float **out) {
  if (!u) return fsdp_fail(FSDP_EINVAL, "unit_state: NULL unit");
  if (kind < FSDP_STATE_PARAM || kind > FSDP_STATE_OPT2)
    return fsdp_fail(FSDP_EINVAL, "unit '%s': state kind %d (expected FSDP_STATE_PARAM, _OPT1 or _OPT2)", u->name, kind);
  if (off < 0 || n < 0 || off + n > u->n_opt)
    return fsdp_fail(FSDP_EINVAL, "unit '%s': state elements [%lld, %lld) outside the %lld this rank holds", u->name,
                     (long long)off, (long long)(off + n), (long long)u->n_opt);
  float *base = kind == FSDP_STATE_PARAM ? u->main : kind == FSDP_STATE_OPT1 ? u->m : u->v;
  *out = base + off;
  return FSDP_OK;
}

int fsdp_unit_state_get(fsdp_unit *u, int kind, int64_t off, int64_t n, float *dst) {
  float *src;
  FSDP_CHECK(state_buffer(u, kind, off, n, &src));
  if (n && !dst) return fsdp_fail(FSDP_EINVAL, "unit_state_get: NULL destination");
  /* the last step's optimizer work (kernels on the shard stream) first */
  FSDP_CHECK(fsdp_unit_synchronize(u));
  return n ? fsdp_memcpy(dst, src, (size_t)n * sizeof(float), NULL) : FSDP_OK;
}

int fsdp_unit_state_set(fsdp_unit *u, int kind, int64_t off, int64_t n, const float *src) {
  float *dst;
  FSDP_CHECK(state_buffer(u, kind, off, n, &dst));
  if (n && !src) return fsdp_fail(FSDP_EINVAL, "unit_state_set: NULL source");
  FSDP_CHECK(fsdp_unit_synchronize(u));
  return n ? fsdp_memcpy(dst, src, (size_t)n * sizeof(float), NULL) : FSDP_OK;
}

int fsdp_unit_state_publish(fsdp_unit *u) {
  if (!u) return fsdp_fail(FSDP_EINVAL, "unit_state_publish: NULL unit");
  FSDP_CHECK(fsdp_unit_synchronize(u));
  FSDP_CHECK(fsdp_unit_publish_params(u));
  return fsdp_unit_synchronize(u);
}
