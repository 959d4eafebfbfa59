/* pool.c: a bounded set of device buffers for full (unsharded) unit params
 * or grads. A released buffer carries an event recorded where its last user
 * ran; the next user's stream waits on that event before writing, so reuse
 * is stream-ordered and never needs a blocking sync. When no free buffer
 * fits, acquire says so (FSDP_DEFERRED) instead of allocating more:
 * prefetch stops at the bound.
 *
 * Slots may differ in size (fully_shard sizes them after the largest units
 * that borrow: a tied embedding of 501 MiB and layers of 116 MiB need one
 * big slot and small ones, not all big). A request takes the smallest free
 * slot that fits (fsdp_pool_pick, which the planner's replay of the
 * schedule calls too, so plan and run choose alike). */
#include <stdlib.h>

#include "../base/error.h"
#include "../dist/comm_impl.h"
#include "../fsdp_shard.h"
#include "pool.h"

struct fsdp_pool {
  int device, nslots, live, peak;
  int64_t *bytes; /* per slot */
  void **buf;
  fsdp_event **released;
  uint8_t *taken;
  fsdp_comm *comm; /* fsdp_pool_register: buffers from comm, registered in mode (held) */
  int mode;
  fsdp_comm_reg **reg;
  int refs; /* its creator's, and one per unit that borrows from it */
};

int fsdp_pool_pick(int nslots, const int64_t *slot_bytes, const uint8_t *taken, int64_t bytes) {
  int best = -1;
  for (int i = 0; i < nslots; i++)
    if (!taken[i] && slot_bytes[i] >= bytes && (best < 0 || slot_bytes[i] < slot_bytes[best])) best = i;
  return best;
}

int fsdp_pool_create(int device, int nslots, const int64_t *slot_bytes, fsdp_pool **out) {
  if (!out) return fsdp_fail(FSDP_EINVAL, "pool: NULL out");
  *out = NULL;
  if (nslots < 1 || !slot_bytes) return fsdp_fail(FSDP_EINVAL, "pool: %d buffers; expected at least 1", nslots);
  for (int i = 0; i < nslots; i++)
    if (slot_bytes[i] < 0) return fsdp_fail(FSDP_EINVAL, "pool: buffer %d of %lld bytes", i, (long long)slot_bytes[i]);
  fsdp_pool *p = calloc(1, sizeof *p);
  if (!p) return fsdp_fail(FSDP_ENOMEM, "pool: out of memory");
  p->device = device;
  p->nslots = nslots;
  p->refs = 1;
  p->bytes = calloc((size_t)nslots, sizeof *p->bytes);
  p->buf = calloc((size_t)nslots, sizeof *p->buf);
  p->released = calloc((size_t)nslots, sizeof *p->released);
  p->taken = calloc((size_t)nslots, sizeof *p->taken);
  int rc = p->bytes && p->buf && p->released && p->taken ? FSDP_OK : fsdp_fail(FSDP_ENOMEM, "pool: out of memory");
  for (int i = 0; i < nslots && rc == FSDP_OK; i++) {
    p->bytes[i] = slot_bytes[i];
    rc = fsdp_alloc(device, (size_t)slot_bytes[i], &p->buf[i]);
    if (rc == FSDP_OK) rc = fsdp_event_create(device, &p->released[i]);
  }
  if (rc < 0) {
    fsdp_pool_destroy(p);
    return rc;
  }
  *out = p;
  return FSDP_OK;
}

void fsdp_pool_retain(fsdp_pool *p) {
  if (p) __atomic_add_fetch(&p->refs, 1, __ATOMIC_RELAXED);
}

/* the last reference frees it: its creator's (fsdp_pool_destroy) or a
 * unit's, whichever goes last */
void fsdp_pool_release(fsdp_pool *p) {
  if (!p || __atomic_sub_fetch(&p->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
  for (int i = 0; i < p->nslots; i++) {
    if (p->released && p->released[i]) {
      /* a CUDA event's destruction does not wait: the slot's last
       * collective may still read a buffer about to be deregistered */
      if (p->comm) fsdp_event_synchronize(p->released[i]);
      fsdp_event_destroy(p->released[i]);
    }
    if (p->reg) fsdp_comm_deregister(p->comm, p->reg[i]);
    if (p->buf && p->buf[i]) {
      if (p->comm) fsdp_comm_mem_free(p->comm, p->mode, p->buf[i]);
      else fsdp_free(p->device, p->buf[i]);
    }
  }
  free(p->reg);
  free(p->bytes);
  free(p->buf);
  free(p->released);
  free(p->taken);
  fsdp_comm_release(p->comm);
  free(p);
}

int fsdp_pool_destroy(fsdp_pool *p) {
  fsdp_pool_release(p);
  return FSDP_OK;
}

int fsdp_pool_park(fsdp_pool *p) {
  if (!p) return fsdp_fail(FSDP_EINVAL, "pool_park: NULL pool");
  if (p->comm) return fsdp_fail(FSDP_EUNSUPPORTED, "pool_park: the pool's buffers are registered with a comm "
                                "(fsdp.comm_register): they cannot be freed and made again");
  for (int i = 0; i < p->nslots; i++)
    if (p->taken[i]) return fsdp_fail(FSDP_ESTATE, "pool_park: buffer %d is in use (a unit is gathered): reshard first", i);
  for (int i = 0; i < p->nslots; i++) {
    if (!p->buf[i]) continue;
    FSDP_CHECK(fsdp_event_synchronize(p->released[i])); /* its last user is done with it */
    fsdp_free(p->device, p->buf[i]);
    p->buf[i] = NULL;
  }
  return FSDP_OK;
}

int fsdp_pool_unpark(fsdp_pool *p) {
  if (!p) return fsdp_fail(FSDP_EINVAL, "pool_unpark: NULL pool");
  for (int i = 0; i < p->nslots; i++)
    if (!p->buf[i]) FSDP_CHECK(fsdp_alloc(p->device, (size_t)p->bytes[i], &p->buf[i]));
  return FSDP_OK;
}

int fsdp_pool_acquire(fsdp_pool *p, size_t bytes, fsdp_stream *user, int *slot, void **ptr) {
  int64_t largest = 0;
  for (int i = 0; i < p->nslots; i++)
    if (p->bytes[i] > largest) largest = p->bytes[i];
  if ((int64_t)bytes > largest)
    return fsdp_fail(FSDP_EINVAL, "pool: a unit needs %zu bytes, the pool's largest buffer holds %lld", bytes,
                     (long long)largest);
  int i = fsdp_pool_pick(p->nslots, p->bytes, p->taken, (int64_t)bytes);
  if (i < 0) return FSDP_DEFERRED; /* no free buffer fits */
  if (!p->buf[i]) return fsdp_fail(FSDP_ESTATE, "pool: its buffers are in host memory (offloaded): onload first");
  /* A buffer is free once given back, which is when its last collective
   * is issued, not done: the unit just resharded or reduced gives back a
   * buffer still being read. Of the free ones of the size the pick chose
   * (the planner's replay counts sizes, so any of them keeps its
   * promises), take one whose last user has finished: on 2 CPU ranks
   * layers had waited 1-40 ms each for the previous layer's
   * reduce-scatter with an idle buffer beside it. Not for NCCL windows:
   * every rank must use the same window, and which buffer is idle depends
   * on each rank's timing. */
  if (p->mode != FSDP_REG_WINDOW && fsdp_event_query(p->released[i]) == 0)
    for (int j = 0; j < p->nslots; j++)
      if (j != i && !p->taken[j] && p->bytes[j] == p->bytes[i] && fsdp_event_query(p->released[j]) == 1) {
        i = j;
        break;
      }
  /* the new user may write only after the previous one finished */
  FSDP_CHECK(fsdp_stream_wait_event(user, p->released[i]));
  p->taken[i] = 1;
  if (++p->live > p->peak) p->peak = p->live;
  *slot = i;
  *ptr = p->buf[i];
  return FSDP_OK;
}

int fsdp_pool_give_back(fsdp_pool *p, int slot, fsdp_stream *last_user) {
  if (slot < 0 || slot >= p->nslots || !p->taken[slot])
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
  p->reg = calloc((size_t)p->nslots, sizeof *p->reg);
  if (!p->reg) return fsdp_fail(FSDP_ENOMEM, "pool: out of memory");
  for (int i = 0; i < p->nslots; i++) { /* the plain buffers give way to the transport's */
    fsdp_free(p->device, p->buf[i]);
    p->buf[i] = NULL;
  }
  p->comm = c;
  fsdp_comm_retain(c);
  p->mode = mode;
  for (int i = 0; i < p->nslots; i++) {
    FSDP_CHECK(fsdp_comm_mem_alloc(c, mode, (size_t)p->bytes[i], &p->buf[i]));
    FSDP_CHECK(fsdp_comm_register(c, p->buf[i], (size_t)p->bytes[i], mode, &p->reg[i]));
  }
  return FSDP_OK;
}

int fsdp_pool_live(const fsdp_pool *p) { return p->live; }
int fsdp_pool_peak(const fsdp_pool *p) { return p->peak; }
