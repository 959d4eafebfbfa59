/* tensor.c: the engine's tensor: a contiguous buffer of one dtype on one
 * device, 1 to 4 dimensions, either owning its memory or viewing a range of
 * another tensor (a parameter inside a unit's flat buffer). A plain struct,
 * so Lua reads its fields directly. */
#include <string.h>

#include "../base/error.h"
#include "../fsdp_device.h"

static int check_shape(const char *op, int ndim, const int64_t *shape, int64_t *numel) {
  if (ndim < 1 || ndim > 4 || !shape) return fsdp_fail(FSDP_EINVAL, "%s: %d dimensions; expected 1 to 4", op, ndim);
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0 || shape[i] > ((int64_t)1 << 40))
      return fsdp_fail(FSDP_EINVAL, "%s: dimension %d has size %lld", op, i, (long long)shape[i]);
    /* checked before multiplying: 2^40 x 2^30 wrapped to 0 elements */
    if (shape[i] && n > ((int64_t)1 << 48) / shape[i])
      return fsdp_fail(FSDP_EINVAL, "%s: too many elements (more than 2^48; dimension %d has size %lld)", op, i,
                       (long long)shape[i]);
    n *= shape[i];
  }
  *numel = n;
  return FSDP_OK;
}

static void set_shape(fsdp_tensor *t, int ndim, const int64_t *shape) {
  t->ndim = ndim;
  for (int i = 0; i < 4; i++) t->shape[i] = i < ndim ? shape[i] : 1;
}

int64_t fsdp_tensor_numel(const fsdp_tensor *t) {
  if (!t) return 0;
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

size_t fsdp_tensor_nbytes(const fsdp_tensor *t) {
  return t ? (size_t)fsdp_tensor_numel(t) * fsdp_dtype_size(t->dtype) : 0;
}

int fsdp_tensor_alloc(fsdp_tensor *t, int device, fsdp_dtype dtype, int ndim, const int64_t *shape) {
  if (!t) return fsdp_fail(FSDP_EINVAL, "tensor_alloc: NULL tensor");
  memset(t, 0, sizeof *t);
  int64_t n = 0;
  FSDP_CHECK(check_shape("tensor_alloc", ndim, shape, &n));
  if (!fsdp_dtype_size(dtype)) return fsdp_fail(FSDP_EINVAL, "tensor_alloc: unknown dtype %d", dtype);
  FSDP_CHECK(fsdp_alloc(device, (size_t)n * fsdp_dtype_size(dtype), &t->data));
  t->dtype = dtype;
  t->device = device;
  t->owns = 1;
  set_shape(t, ndim, shape);
  return FSDP_OK;
}

int fsdp_tensor_view(fsdp_tensor *t, const fsdp_tensor *base, int64_t offset, int ndim, const int64_t *shape) {
  if (!t || !base || !base->data) return fsdp_fail(FSDP_EINVAL, "tensor_view: NULL or freed base");
  int64_t n = 0;
  FSDP_CHECK(check_shape("tensor_view", ndim, shape, &n));
  int64_t have = fsdp_tensor_numel(base);
  if (offset < 0 || offset > have || n > have - offset)
    return fsdp_fail(FSDP_EINVAL, "tensor_view: elements [%lld, %lld) are outside the base's %lld", (long long)offset,
                     (long long)(offset + n), (long long)have);
  fsdp_tensor v = {0};
  v.data = (char *)base->data + (size_t)offset * fsdp_dtype_size(base->dtype);
  v.dtype = base->dtype;
  v.device = base->device;
  v.owns = 0;
  set_shape(&v, ndim, shape);
  *t = v;
  return FSDP_OK;
}

int fsdp_tensor_free(fsdp_tensor *t) {
  if (!t || !t->data) return FSDP_OK;
  int rc = t->owns ? fsdp_free(t->device, t->data) : FSDP_OK;
  t->data = NULL;
  return rc;
}
