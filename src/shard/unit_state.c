/* unit_state.c: a unit's training state as checkpoints see it: the fp32
 * main params and the optimizer's two arrays (AdamW's exp_avg and
 * exp_avg_sq; SGD's momentum in the first), addressed by parameter element
 * ranges, independent of world size, ZeRO level and unit grouping (and of
 * whether the main params are split). Which ranges a rank holds and saves:
 * fsdp_unit_state_pieces (unit.c). */
#include "../base/error.h"
#include "../fsdp_shard.h"
#include "unit_impl.h"

int64_t fsdp_unit_state_numel(const fsdp_unit *u) { return u ? u->opt_numel : 0; }

/* the fp32 array of a kind; *out NULL for split main params */
static int state_buffer(fsdp_unit *u, int kind, int64_t off, int64_t n, float **out) {
  if (!u) return fsdp_fail(FSDP_EINVAL, "unit_state: NULL unit");
  if (kind < FSDP_STATE_PARAM || kind > FSDP_STATE_OPT2)
    return fsdp_fail(FSDP_EINVAL, "unit '%s': state kind %d (expected FSDP_STATE_PARAM, _OPT1 or _OPT2)", u->name, kind);
  if (off < 0 || n < 0 || off + n > u->opt_numel)
    return fsdp_fail(FSDP_EINVAL, "unit '%s': state elements [%lld, %lld) outside the %lld this rank holds", u->name,
                     (long long)off, (long long)(off + n), (long long)u->opt_numel);
  float *base = kind == FSDP_STATE_PARAM ? u->main_params : kind == FSDP_STATE_OPT1 ? u->opt1 : u->opt2;
  *out = base ? base + off : NULL;
  return FSDP_OK;
}

int fsdp_unit_state_get(fsdp_unit *u, int kind, int64_t off, int64_t n, float *dst) {
  float *src = NULL;
  FSDP_CHECK(state_buffer(u, kind, off, n, &src));
  FSDP_CHECK(fsdp_unit_placed_check(u, 1, "state_get()"));
  if (n && !dst) return fsdp_fail(FSDP_EINVAL, "unit_state_get: NULL destination");
  /* the last step's optimizer work (kernels on the shard stream) first */
  FSDP_CHECK(fsdp_unit_synchronize(u));
  if (!n) return FSDP_OK;
  return src ? fsdp_memcpy(dst, src, (size_t)n * sizeof(float), NULL) : fsdp_unit_split_params(u, off, n, dst, NULL);
}

int fsdp_unit_state_set(fsdp_unit *u, int kind, int64_t off, int64_t n, const float *src) {
  float *dst = NULL;
  FSDP_CHECK(state_buffer(u, kind, off, n, &dst));
  FSDP_CHECK(fsdp_unit_placed_check(u, 1, "state_set()"));
  if (n && !src) return fsdp_fail(FSDP_EINVAL, "unit_state_set: NULL source");
  FSDP_CHECK(fsdp_unit_synchronize(u));
  if (!n) return FSDP_OK;
  return dst ? fsdp_memcpy(dst, src, (size_t)n * sizeof(float), NULL) : fsdp_unit_split_params(u, off, n, NULL, src);
}

int fsdp_unit_state_publish(fsdp_unit *u) {
  if (!u) return fsdp_fail(FSDP_EINVAL, "unit_state_publish: NULL unit");
  FSDP_CHECK(fsdp_unit_placed_check(u, 1, "state_publish()"));
  FSDP_CHECK(fsdp_unit_synchronize(u));
  FSDP_CHECK(fsdp_unit_publish_params(u));
  return fsdp_unit_synchronize(u);
}
