/* comm_register.c: user-buffer registration with a comm's transport.
 *
 * NCCL copies through its own staging buffers unless the user's buffers
 * are registered with the communicator; registered buffers let it move the
 * data in place (NVLink peer access, and NVLink SHARP on NVSwitch systems,
 * where the buffers must also come from ncclMemAlloc). FSDP's buffers are
 * long-lived and reused every step, so registering them once pays. Off by
 * default (fsdp.comm_register): it pins memory in NCCL's tables and
 * symmetric windows are collective calls. The CPU transport has nothing to
 * register: the calls succeed and the handle says so. */
#include <stdlib.h>

#include "../base/error.h"
#include "../device/device_impl.h"
#include "../fsdp_dist.h"
#include "comm_impl.h"

struct fsdp_comm_reg {
  int mode;
  void *handle; /* the transport's; NULL when it registered nothing */
};

static int check_mode(const fsdp_comm *c, int mode, const char *what) {
  if (!c) return fsdp_fail(FSDP_EINVAL, "%s: NULL comm", what);
  if (mode != FSDP_REG_NONE && mode != FSDP_REG_BUFFER && mode != FSDP_REG_WINDOW)
    return fsdp_fail(FSDP_EINVAL, "%s: mode %d; expected FSDP_REG_NONE, FSDP_REG_BUFFER or FSDP_REG_WINDOW", what,
                     mode);
  return FSDP_OK;
}

int fsdp_comm_mem_alloc(fsdp_comm *c, int mode, size_t bytes, void **out) {
  FSDP_CHECK(check_mode(c, mode, "comm_mem_alloc"));
  if (!out) return fsdp_fail(FSDP_EINVAL, "comm_mem_alloc: NULL out");
  *out = NULL;
  if (mode == FSDP_REG_NONE || !c->ops->mem_alloc) {
    FSDP_CHECK(fsdp_alloc(c->device, bytes, out));
  } else {
    FSDP_CHECK(c->ops->mem_alloc(c, bytes ? bytes : 1, out));
  }
  int rc = fsdp_memset(*out, 0, bytes, NULL);
  if (rc < 0) {
    fsdp_comm_mem_free(c, mode, *out);
    *out = NULL;
  }
  return rc;
}

int fsdp_comm_mem_free(fsdp_comm *c, int mode, void *p) {
  if (!p) return FSDP_OK;
  FSDP_CHECK(check_mode(c, mode, "comm_mem_free"));
  if (mode == FSDP_REG_NONE || !c->ops->mem_free) return fsdp_free(c->device, p);
  c->ops->mem_free(c, p);
  return FSDP_OK;
}

int fsdp_comm_register(fsdp_comm *c, void *buf, size_t bytes, int mode, fsdp_comm_reg **out) {
  FSDP_CHECK(check_mode(c, mode, "comm_register"));
  if (!out || (!buf && bytes)) return fsdp_fail(FSDP_EINVAL, "comm_register: NULL buffer or out");
  *out = NULL;
  fsdp_comm_reg *r = calloc(1, sizeof *r);
  if (!r) return fsdp_fail(FSDP_ENOMEM, "comm_register: out of memory");
  r->mode = mode;
  if (mode != FSDP_REG_NONE && bytes && c->ops->register_buffer) {
    int rc = c->ops->register_buffer(c, buf, bytes, mode, &r->handle);
    if (rc < 0) {
      free(r);
      return rc;
    }
  }
  *out = r;
  return FSDP_OK;
}

int fsdp_comm_reg_active(const fsdp_comm_reg *r) { return r && r->handle != NULL; }

int fsdp_comm_deregister(fsdp_comm *c, fsdp_comm_reg *r) {
  if (!r) return FSDP_OK;
  if (!c) return fsdp_fail(FSDP_EINVAL, "comm_deregister: NULL comm");
  if (r->handle && c->ops->deregister_buffer) c->ops->deregister_buffer(c, r->handle, r->mode);
  free(r);
  return FSDP_OK;
}
