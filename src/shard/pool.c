/* pool.c: a bounded set of equally sized device buffers for full (unsharded)
 * unit params or grads. A released buffer carries an event recorded where
 * its last user ran; the next user's stream waits on that event before
 * writing, so reuse is stream-ordered and never needs a blocking sync.
 * When every buffer is taken, acquire says so (returns 1) instead of
 * allocating more: prefetch stops at the bound. */
#include <stdlib.h>

#include "../base/error.h"
#include "pool.h"

struct fsdp_pool {
  int device, max_live, live, peak;
  size_t bytes;
  void **buf;
  fsdp_event **released;
  int *taken;
  fsdp_comm *comm; /* fsdp_pool_register: buffers from comm, registered in mode */
  int mode;
  fsdp_comm_reg **reg;
};

int fsdp_pool_create(int device, size_t bytes, int max_live, fsdp_pool **out) {
  *out = NULL;
  if (max_live < 1) return fsdp_fail(FSDP_EINVAL, "pool: max_live_units must be >= 1, got %d", max_live);
  fsdp_pool *p = calloc(1, sizeof *p);
  if (!p) return fsdp_fail(FSDP_ENOMEM, "pool: out of memory");
  p->device = device;
  p->max_live = max_live;
  p->bytes = bytes;
  p->buf = calloc((size_t)max_live, sizeof *p->buf);
  p->released = calloc((size_t)max_live, sizeof *p->released);
  p->taken = calloc((size_t)max_live, sizeof *p->taken);
  int rc = p->buf && p->released && p->taken ? FSDP_OK : fsdp_fail(FSDP_ENOMEM, "pool: out of memory");
  for (int i = 0; i < max_live && rc == FSDP_OK; i++) {
    rc = fsdp_alloc(device, bytes, &p->buf[i]);
    if (rc == FSDP_OK) rc = fsdp_event_create(device, &p->released[i]);
  }
  if (rc < 0) {
    fsdp_pool_destroy(p);
    return rc;
  }
  *out = p;
  return FSDP_OK;
}

int fsdp_pool_destroy(fsdp_pool *p) {
  if (!p) return FSDP_OK;
  for (int i = 0; i < p->max_live; i++) {
    if (p->released && p->released[i]) fsdp_event_destroy(p->released[i]); /* waits for its last user */
    if (p->reg) fsdp_comm_deregister(p->comm, p->reg[i]);
    if (p->buf && p->buf[i]) {
      if (p->comm) fsdp_comm_mem_free(p->comm, p->mode, p->buf[i]);
      else fsdp_free(p->device, p->buf[i]);
    }
  }
  free(p->reg);
  free(p->buf);
  free(p->released);
  free(p->taken);
  free(p);
  return FSDP_OK;
}

int fsdp_pool_acquire(fsdp_pool *p, size_t bytes, fsdp_stream *user, int *slot, void **ptr) {
  if (bytes > p->bytes)
    return fsdp_fail(FSDP_EINVAL, "pool: a unit needs %zu bytes, the pool's buffers hold %zu", bytes, p->bytes);
  for (int i = 0; i < p->max_live; i++) {
    if (p->taken[i]) continue;
    /* the new user may write only after the previous one finished */
    FSDP_CHECK(fsdp_stream_wait_event(user, p->released[i]));
    p->taken[i] = 1;
    if (++p->live > p->peak) p->peak = p->live;
    *slot = i;
    *ptr = p->buf[i];
    return FSDP_OK;
  }
  return 1; /* at the bound */
}

int fsdp_pool_release(fsdp_pool *p, int slot, fsdp_stream *last_user) {
  if (slot < 0 || slot >= p->max_live || !p->taken[slot])
    return fsdp_fail(FSDP_ESTATE, "pool: releasing buffer %d, which is not taken", slot);
  FSDP_CHECK(fsdp_event_record(p->released[slot], last_user));
  p->taken[slot] = 0;
  p->live--;
  return FSDP_OK;
}

int fsdp_pool_register(fsdp_pool *p, fsdp_comm *c, int mode) {
  if (!p || !c) return fsdp_fail(FSDP_EINVAL, "pool_register: NULL pool or comm");
  if (p->comm) return fsdp_fail(FSDP_ESTATE, "pool_register: the pool is registered already");
  if (p->live || p->peak) return fsdp_fail(FSDP_ESTATE, "pool_register: buffers were handed out already");
  if (fsdp_comm_device(c) != p->device) return fsdp_fail(FSDP_EINVAL, "pool_register: the comm is on another device");
  p->reg = calloc((size_t)p->max_live, sizeof *p->reg);
  if (!p->reg) return fsdp_fail(FSDP_ENOMEM, "pool: out of memory");
  for (int i = 0; i < p->max_live; i++) { /* the plain buffers give way to the transport's */
    fsdp_free(p->device, p->buf[i]);
    p->buf[i] = NULL;
  }
  p->comm = c;
  p->mode = mode;
  for (int i = 0; i < p->max_live; i++) {
    FSDP_CHECK(fsdp_comm_mem_alloc(c, mode, p->bytes, &p->buf[i]));
    FSDP_CHECK(fsdp_comm_register(c, p->buf[i], p->bytes, mode, &p->reg[i]));
  }
  return FSDP_OK;
}

int fsdp_pool_live(const fsdp_pool *p) { return p->live; }
int fsdp_pool_peak(const fsdp_pool *p) { return p->peak; }
