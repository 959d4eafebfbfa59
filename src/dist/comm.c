/* comm.c: the collectives' public entry points. Arguments are checked here,
 * once for every transport, so that a caller's mistake gets the same message
 * on CPU and GPU; the backend (comm_shm.c, comm_nccl.c) only moves bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/error.h"
#include "../device/device_impl.h"
#include "../fsdp_dist.h"
#include "comm_impl.h"

int fsdp_comm_init_common(fsdp_comm *c, const comm_group_spec *spec, int device, const comm_ops *ops) {
  c->ops = ops;
  c->refs = 1;
  snprintf(c->name, sizeof c->name, "%s", spec->name);
  c->rank = spec->my_index;
  c->size = spec->size;
  c->device = device;
  c->timeout_s = fsdp_comm_default_timeout();
  c->members = malloc(sizeof(int) * (size_t)spec->size);
  if (!c->members) return fsdp_fail(FSDP_ENOMEM, "comm '%s': out of memory", spec->name);
  memcpy(c->members, spec->members, sizeof(int) * (size_t)spec->size);
  return FSDP_OK;
}

int fsdp_comm_scratch_reserve(fsdp_comm *c, size_t bytes) {
  if (!c) return fsdp_fail(FSDP_EINVAL, "comm_scratch_reserve: NULL comm");
  /* the new user writes it at once (meta init): nothing queued may still use it */
  FSDP_CHECK(fsdp_stream_synchronize(c->stream));
  if (c->scratch_bytes < bytes) {
    void *p = NULL;
    FSDP_CHECK(fsdp_alloc(c->device, bytes, &p));
    if (c->scratch) fsdp_free(c->device, c->scratch);
    c->scratch = p;
    c->scratch_bytes = bytes;
  }
  c->scratch_users++;
  return FSDP_OK;
}

void fsdp_comm_scratch_release(fsdp_comm *c) {
  if (!c || c->scratch_users <= 0 || --c->scratch_users > 0) return;
  fsdp_stream_synchronize(c->stream);
  fsdp_free(c->device, c->scratch);
  c->scratch = NULL;
  c->scratch_bytes = 0;
}

int64_t fsdp_comm_scratch_bytes(const fsdp_comm *c) { return c ? (int64_t)c->scratch_bytes : 0; }

void fsdp_comm_free(fsdp_comm *c) {
  if (!c) return;
  if (c->scratch) { /* units left alive past their comm: do not leak the scratch */
    fsdp_stream_synchronize(c->stream);
    fsdp_free(c->device, c->scratch);
    c->scratch = NULL;
  }
  if (c->ops && c->ops->destroy) c->ops->destroy(c);
  free(c->members);
  free(c);
}

void fsdp_comm_retain(fsdp_comm *c) {
  if (c) __atomic_add_fetch(&c->refs, 1, __ATOMIC_RELAXED);
}

void fsdp_comm_release(fsdp_comm *c) {
  if (c && __atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) == 0) fsdp_comm_free(c);
}

int fsdp_comm_rank(const fsdp_comm *c) { return c ? c->rank : fsdp_fail(FSDP_EINVAL, "comm_rank: NULL comm"); }
int fsdp_comm_size(const fsdp_comm *c) { return c ? c->size : fsdp_fail(FSDP_EINVAL, "comm_size: NULL comm"); }
int fsdp_comm_device(const fsdp_comm *c) { return c ? c->device : fsdp_fail(FSDP_EINVAL, "comm_device: NULL comm"); }
const char *fsdp_comm_name(const fsdp_comm *c) { return c ? c->name : "(null)"; }
fsdp_stream *fsdp_comm_stream(fsdp_comm *c) { return c ? c->stream : NULL; }

int fsdp_comm_member(const fsdp_comm *c, int i) {
  if (!c) return fsdp_fail(FSDP_EINVAL, "comm_member: NULL comm");
  if (i < 0 || i >= c->size)
    return fsdp_fail(FSDP_EINVAL, "comm '%s': member %d out of range [0, %d)", c->name, i, c->size);
  return c->members[i];
}

int fsdp_comm_set_timeout(fsdp_comm *c, double seconds) {
  if (!c) return fsdp_fail(FSDP_EINVAL, "comm_set_timeout: NULL comm");
  if (!(seconds > 0)) return fsdp_fail(FSDP_EINVAL, "comm '%s': timeout must be > 0 seconds", c->name);
  c->timeout_s = seconds;
  return FSDP_OK;
}

/* dtype known, and count * elements * size fits in size_t */
static int check_buffer(const fsdp_comm *c, const char *op, const char *which, const void *p, size_t count,
                        size_t mult, int dtype) {
  size_t es = fsdp_dtype_size(dtype);
  if (!es || dtype == FSDP_FP64 || dtype == FSDP_INT32)
    return fsdp_fail(FSDP_EINVAL, "%s on '%s': %s dtype %d is not one of fp32, bf16, fp16", op, c->name,
                     which, dtype);
  if (count && mult && count > SIZE_MAX / mult / es)
    return fsdp_fail(FSDP_EINVAL, "%s on '%s': %zu x %zu elements overflow", op, c->name, count, mult);
  if (count && !p) return fsdp_fail(FSDP_EINVAL, "%s on '%s': %s is NULL", op, c->name, which);
  return FSDP_OK;
}

static int check_op(const fsdp_comm *c, const char *name, int op) {
  if (op != FSDP_SUM && op != FSDP_AVG)
    return fsdp_fail(FSDP_EINVAL, "%s on '%s': unknown reduction %d (expected sum or avg)", name, c->name, op);
  return FSDP_OK;
}

#define NEED_COMM(c, op) \
  if (!(c)) return fsdp_fail(FSDP_EINVAL, "%s: NULL comm", op)

/* A collective the transport took (rc >= 0): its full buffer's bytes and
 * one call added to its kind's counts (fsdp_comm_bytes_sent) */
static int counted(fsdp_comm *c, int kind, size_t count, size_t members, int dtype, int rc) {
  if (rc < 0) return rc;
  __atomic_fetch_add(&c->full_bytes[kind], (uint64_t)count * members * fsdp_dtype_size(dtype), __ATOMIC_RELAXED);
  __atomic_fetch_add(&c->calls[kind], 1, __ATOMIC_RELAXED);
  return rc;
}

static int known_kind(const fsdp_comm *c, const char *what, int kind) {
  if (!c) return fsdp_fail(FSDP_EINVAL, "%s: NULL comm", what);
  if (kind < 0 || kind > FSDP_COMM_KINDS)
    return fsdp_fail(FSDP_EINVAL, "%s on '%s': kind %d (expected FSDP_COMM_ALL_GATHER .. FSDP_COMM_SHIFT, or "
                     "FSDP_COMM_KINDS for all)", what, c->name, kind);
  return FSDP_OK;
}

double fsdp_comm_bytes_sent(const fsdp_comm *c, int kind) {
  if (known_kind(c, "comm_bytes_sent", kind) < 0) return -1;
  double n = c->size, sent = 0;
  for (int k = 0; k < FSDP_COMM_KINDS; k++) {
    if (kind != FSDP_COMM_KINDS && k != kind) continue;
    /* of the full buffer: (n-1)/n, twice that for an all-reduce (ring reduce-scatter, then all-gather);
     * a shift's is what it sends, all of it */
    double full = (double)__atomic_load_n(&c->full_bytes[k], __ATOMIC_RELAXED);
    sent += k == FSDP_COMM_SHIFT ? full : (k == FSDP_COMM_ALL_REDUCE ? 2 : 1) * full * (n - 1) / n;
  }
  return sent;
}

int64_t fsdp_comm_calls(const fsdp_comm *c, int kind) {
  FSDP_CHECK(known_kind(c, "comm_calls", kind));
  uint64_t calls = 0;
  for (int k = 0; k < FSDP_COMM_KINDS; k++)
    if (kind == FSDP_COMM_KINDS || k == kind) calls += __atomic_load_n(&c->calls[k], __ATOMIC_RELAXED);
  return (int64_t)calls;
}

int fsdp_comm_bytes_reset(fsdp_comm *c) {
  NEED_COMM(c, "comm_bytes_reset");
  for (int k = 0; k < FSDP_COMM_KINDS; k++) {
    __atomic_store_n(&c->full_bytes[k], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&c->calls[k], 0, __ATOMIC_RELAXED);
  }
  return FSDP_OK;
}

int fsdp_comm_all_gather(fsdp_comm *c, void *out, const void *in, size_t count, fsdp_dtype dtype) {
  NEED_COMM(c, "all_gather");
  FSDP_CHECK(check_buffer(c, "all_gather", "in", in, count, 1, dtype));
  FSDP_CHECK(check_buffer(c, "all_gather", "out", out, count, (size_t)c->size, dtype));
  return counted(c, FSDP_COMM_ALL_GATHER, count, (size_t)c->size, dtype, c->ops->all_gather(c, out, in, count, dtype));
}

int fsdp_comm_reduce_scatter(fsdp_comm *c, void *out, fsdp_dtype out_dtype, const void *in, fsdp_dtype in_dtype,
                             size_t count, int op) {
  NEED_COMM(c, "reduce_scatter");
  FSDP_CHECK(check_buffer(c, "reduce_scatter", "in", in, count, (size_t)c->size, in_dtype));
  FSDP_CHECK(check_buffer(c, "reduce_scatter", "out", out, count, 1, out_dtype));
  FSDP_CHECK(check_op(c, "reduce_scatter", op));
  if (in_dtype != out_dtype && !(out_dtype == FSDP_FP32 && (in_dtype == FSDP_BF16 || in_dtype == FSDP_FP16)))
    return fsdp_fail(FSDP_EINVAL,
                     "reduce_scatter on '%s': %s in, %s out is not supported (same dtype, or bf16/fp16 in "
                     "with fp32 out)", c->name, fsdp_dtype_name(in_dtype), fsdp_dtype_name(out_dtype));
  return counted(c, FSDP_COMM_REDUCE_SCATTER, count, (size_t)c->size, out_dtype,
                 c->ops->reduce_scatter(c, out, out_dtype, in, in_dtype, count, op));
}

int fsdp_comm_all_reduce(fsdp_comm *c, void *out, const void *in, size_t count, fsdp_dtype dtype, int op) {
  NEED_COMM(c, "all_reduce");
  FSDP_CHECK(check_buffer(c, "all_reduce", "in", in, count, 1, dtype));
  FSDP_CHECK(check_buffer(c, "all_reduce", "out", out, count, 1, dtype));
  FSDP_CHECK(check_op(c, "all_reduce", op));
  return counted(c, FSDP_COMM_ALL_REDUCE, count, 1, dtype, c->ops->all_reduce(c, out, in, count, dtype, op));
}

int fsdp_comm_broadcast(fsdp_comm *c, void *buf, size_t count, fsdp_dtype dtype, int root) {
  NEED_COMM(c, "broadcast");
  FSDP_CHECK(check_buffer(c, "broadcast", "buf", buf, count, 1, dtype));
  if (root < 0 || root >= c->size)
    return fsdp_fail(FSDP_EINVAL, "broadcast on '%s': root %d out of range [0, %d)", c->name, root, c->size);
  return counted(c, FSDP_COMM_BROADCAST, count, 1, dtype, c->ops->broadcast(c, buf, count, dtype, root));
}

int fsdp_comm_shift(fsdp_comm *c, void *out, const void *in, size_t count, fsdp_dtype dtype, int dist) {
  NEED_COMM(c, "shift");
  FSDP_CHECK(check_buffer(c, "shift", "in", in, count, 1, dtype));
  FSDP_CHECK(check_buffer(c, "shift", "out", out, count, 1, dtype));
  size_t bytes = count * fsdp_dtype_size(dtype);
  /* a member's out is written while its next member may still read its in
   * (shm), or while NCCL sends it: no overlap, even of a copy */
  uintptr_t o = (uintptr_t)out, i = (uintptr_t)in;
  if (bytes && o < i + bytes && i < o + bytes)
    return fsdp_fail(FSDP_EINVAL, "shift on '%s': out and in overlap (%zu bytes at %p and %p); give separate buffers",
                     c->name, bytes, out, in);
  int n = c->size, d = dist % n;
  if (d < 0) d += n;
  /* a copy sends nothing; still one call */
  return counted(c, FSDP_COMM_SHIFT, d ? count : 0, 1, dtype, c->ops->shift(c, out, in, count, dtype, d));
}

int fsdp_comm_barrier(fsdp_comm *c) {
  NEED_COMM(c, "barrier");
  return c->ops->barrier(c);
}

int fsdp_comm_synchronize(fsdp_comm *c) {
  NEED_COMM(c, "comm_synchronize");
  /* the transports' messages already name the comm */
  return c->ops->synchronize ? c->ops->synchronize(c) : fsdp_stream_synchronize(c->stream);
}

/* See comm_impl.h. A member that could not join (map the segment, open
 * the communicator) makes every member fail at once, naming it, instead of
 * leaving them in their first barrier until the timeout. */
int fsdp_comm_joined_everywhere(const comm_group_spec *spec, const char *key, int my_rc) {
  char st_key[300], msg[512];
  snprintf(st_key, sizeof st_key, "%s.st", key);
  snprintf(msg, sizeof msg, "%s", my_rc < 0 ? fsdp_last_error() : "");
  int rc = fsdp_kv_put(st_key, msg, strlen(msg) + 1);
  int frc = fsdp_kv_fence(0);
  if (my_rc < 0) return fsdp_fail(my_rc, "%s", msg);
  FSDP_CHECK(rc);
  FSDP_CHECK(frc);
  for (int i = 0; i < spec->size; i++) {
    size_t len = 0;
    if (i == spec->my_index) continue;
    FSDP_CHECK(fsdp_kv_get(spec->members[i], st_key, msg, sizeof msg, &len));
    msg[sizeof msg - 1] = '\0';
    if (msg[0])
      return fsdp_fail(FSDP_EPEER, "comm '%s': rank %d (member %d) could not join the group: %s", spec->name,
                       spec->members[i], i, msg);
  }
  return FSDP_OK;
}
