/* comm_shm.c: collectives between CPU ranks on one node, through one shared
 * memory segment per group.
 *
 * Algorithm: staged direct exchange, chunked. Each member owns two staging
 * slots (double buffering) of FSDP_SHM_CHUNK bytes (default 2 MiB). One step
 * moves one chunk: every member copies its piece into its slot, one barrier,
 * then every member reads what it needs straight from the others' slots.
 *   all_gather      write my chunk; read every slot into its place
 *   reduce_scatter  write the n pieces of my input; reduce piece `me` of all
 *   all_reduce      write my chunk; reduce my 1/n portion of it in place in my
 *                   slot; barrier; read every member's reduced portion
 *   broadcast       root writes; the others read
 *   shift           write my chunk; read the slot of member (me - dist) mod n
 *                   (dist a multiple of n: one barrier, then a local copy)
 * Reductions add members in rank order with fp32 accumulation and round once,
 * so every member gets bit-identical results and runs are reproducible.
 * Alternating the two slots means the next step may start writing while a
 * slow member still reads the previous one; one barrier per step suffices.
 *
 * Safety: every collective first publishes a descriptor (kind, count, dtypes,
 * root or a shift's dist) and checks everyone's after the first barrier, so
 * ranks that call different collectives fail with a message instead of
 * corrupting data or hanging. Waits are bounded (timeout) and notice dead peers.
 * The segment's name is removed as soon as every member has mapped it (or
 * the creation failed), by every member that knows it, so that a member
 * dying then leaves nothing behind in /dev/shm; fsdprun removes what a
 * rank killed earlier left (the names carry the job's namespace). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/bf16.h"
#include "../base/error.h"
#include "../base/heartbeat.h"
#include "../base/log.h"
#include "../device/device_impl.h"
#include "../fsdp_dist.h"
#include "comm_impl.h"
#include "shm_segment.h"
#include "shm_sync.h"

#define SHM_MAGIC 0x46534450u /* "FSDP" */
#define SHM_MAX_MEMBERS 256
#define SHM_DATA_OFFSET (64u * 1024u)

enum { OP_ALL_GATHER = 1, OP_REDUCE_SCATTER, OP_ALL_REDUCE, OP_BROADCAST, OP_BARRIER, OP_SHIFT };
static const char *op_names[] = {"?", "all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier", "shift"};

typedef struct op_desc {
  uint64_t seq, count;
  int32_t kind, dtype, out_dtype, op, root, pad; /* root: a broadcast's; a shift's dist, in [0, n) */
} op_desc;

typedef struct shm_header {
  uint32_t magic, n;
  uint64_t chunk;
  shm_barrier bar;
  _Atomic int32_t failed;
  _Atomic int32_t msg_claimed; /* first failure writes fail_msg, then sets failed */
  char fail_msg[512];
  _Atomic int32_t pids[SHM_MAX_MEMBERS];
  _Atomic uint64_t arrived[SHM_MAX_MEMBERS];
  op_desc desc[SHM_MAX_MEMBERS][2];
} shm_header;

_Static_assert(sizeof(shm_header) <= SHM_DATA_OFFSET, "shm header overlaps the data");

typedef struct shm_comm {
  shm_header *hdr; /* NULL for a group of one */
  size_t map_bytes;
  uint64_t seq;    /* collectives issued (worker thread only) */
  uint64_t step;   /* chunk steps taken: picks the slot half */
  int spin;
  float *acc;      /* fp32 accumulator, one chunk of elements */
} shm_comm;

typedef struct coll {
  fsdp_comm *c;
  int kind, dtype, out_dtype, op, root; /* root: as in op_desc */
  void *out;
  const void *in;
  size_t count;
} coll;

static char *slot(shm_comm *s, int member, uint64_t half) {
  return (char *)s->hdr + SHM_DATA_OFFSET + ((size_t)member * 2 + (size_t)half) * s->hdr->chunk;
}

/* ---- element conversion and reduction ---- */


static void store_block(void *dst, int dt, size_t off, const float *acc, size_t len) {
  if (dt == FSDP_FP32) {
    memcpy((float *)dst + off, acc, len * sizeof(float));
  } else if (dt == FSDP_BF16) {
    uint16_t *d = (uint16_t *)dst + off;
    for (size_t i = 0; i < len; i++) d[i] = fsdp_bf16_round(acc[i]);
  } else {
    uint16_t *d = (uint16_t *)dst + off;
    for (size_t i = 0; i < len; i++) d[i] = fsdp_f32_to_fp16(acc[i]);
  }
}

static void accumulate(float *restrict acc, const void *restrict src, int dt, size_t len, int first) {
  if (dt == FSDP_FP32) {
    const float *s = src;
    if (first)
      memcpy(acc, s, len * sizeof(float));
    else
      for (size_t i = 0; i < len; i++) acc[i] += s[i];
  } else if (dt == FSDP_BF16) {
    const uint16_t *s = src;
    if (first)
      for (size_t i = 0; i < len; i++) acc[i] = fsdp_bf16_load(s[i]);
    else
      for (size_t i = 0; i < len; i++) acc[i] += fsdp_bf16_load(s[i]);
  } else {
    const uint16_t *s = src;
    for (size_t i = 0; i < len; i++) acc[i] = (first ? 0.0f : acc[i]) + fsdp_fp16_to_f32(s[i]);
  }
}

/* dst[dst_off ..+len) = op over members j of (slot j + src_off)[0..len).
 * Blocked so the fp32 accumulator stays in L1 while every member is added. */
static void reduce_members(shm_comm *s, uint64_t half, size_t src_off_bytes, int in_dt, void *dst, int out_dt,
                           size_t dst_off, size_t len, int op) {
  enum { BLOCK = 4096 };
  int n = (int)s->hdr->n;
  size_t es = fsdp_dtype_size(in_dt);
  for (size_t b = 0; b < len; b += BLOCK) {
    size_t m = len - b < BLOCK ? len - b : BLOCK;
    for (int j = 0; j < n; j++) accumulate(s->acc, slot(s, j, half) + src_off_bytes + b * es, in_dt, m, j == 0);
    if (op == FSDP_AVG)
      for (size_t i = 0; i < m; i++) s->acc[i] /= (float)n;
    store_block(dst, out_dt, dst_off + b, s->acc, m);
  }
}

/* ---- synchronisation with error reporting ---- */

/* Tells the other members why the group failed; the first failure wins. */
static void mark_failed(shm_comm *s, const char *msg) {
  if (!atomic_exchange(&s->hdr->msg_claimed, 1)) {
    snprintf(s->hdr->fail_msg, sizeof s->hdr->fail_msg, "%s", msg);
    shm_fail_wake(&s->hdr->bar, &s->hdr->failed);
  }
}

static int group_failed(fsdp_comm *c, shm_comm *s, int status, const char *msg) {
  int rc = fsdp_fail(status, "comm '%s': %s", c->name, msg);
  mark_failed(s, fsdp_last_error());
  return rc;
}

static int step_barrier(fsdp_comm *c, shm_comm *s, const char *what) {
  shm_watch w = {s->hdr->pids, s->hdr->arrived, &s->hdr->failed, (int)s->hdr->n, c->rank, s->spin,
                 shm_now() + c->timeout_s};
  int culprit = -1, rc;
  switch (shm_barrier_wait(&s->hdr->bar, &w, &culprit)) {
    case SHM_WAIT_OK: return FSDP_OK;
    case SHM_WAIT_DEAD:
      rc = fsdp_fail(FSDP_EPEER, "comm '%s': rank %d (member %d, pid %d) died during %s", c->name,
                     c->members[culprit], culprit, (int)s->hdr->pids[culprit], what);
      break;
    case SHM_WAIT_TIMEOUT:
      rc = fsdp_fail(FSDP_ETIMEOUT,
                     "comm '%s': %s waited %.0f s for rank %d (member %d), which never arrived (it may be "
                     "stuck, or calling collectives in another order)",
                     c->name, what, c->timeout_s, culprit >= 0 ? c->members[culprit] : -1, culprit);
      break;
    default:
      return fsdp_fail(FSDP_ECOMM, "%s (seen first by another member)", s->hdr->fail_msg);
  }
  mark_failed(s, fsdp_last_error());
  return rc;
}

static void describe(char *buf, size_t cap, const op_desc *d) {
  char extra[32] = ""; /* only the kinds that have one */
  if (d->kind == OP_BROADCAST) snprintf(extra, sizeof extra, ", root=%d", d->root);
  if (d->kind == OP_SHIFT) snprintf(extra, sizeof extra, ", dist=%d", d->root);
  snprintf(buf, cap, "%s(count=%llu, %s%s%s%s)", op_names[d->kind], (unsigned long long)d->count,
           fsdp_dtype_name(d->dtype), d->out_dtype != d->dtype ? "->" : "",
           d->out_dtype != d->dtype ? fsdp_dtype_name(d->out_dtype) : "", extra);
}

/* After the first barrier of a collective, everyone's descriptor is visible. */
static int check_descriptors(fsdp_comm *c, shm_comm *s, const op_desc *mine) {
  for (int j = 0; j < (int)s->hdr->n; j++) {
    const op_desc *d = &s->hdr->desc[j][mine->seq & 1];
    if (d->seq == mine->seq && d->kind == mine->kind && d->count == mine->count && d->dtype == mine->dtype &&
        d->out_dtype == mine->out_dtype && d->op == mine->op && d->root == mine->root)
      continue;
    char a[160], b[160], msg[400];
    describe(a, sizeof a, mine);
    describe(b, sizeof b, d);
    snprintf(msg, sizeof msg, "collective #%llu: rank %d called %s but rank %d called %s",
             (unsigned long long)mine->seq, c->members[c->rank], a, c->members[j], b);
    return group_failed(c, s, FSDP_ECOMM, msg);
  }
  return FSDP_OK;
}

/* ---- the collectives, run on the comm's worker thread ---- */

static size_t nsteps(size_t count, size_t per_step) { return count ? (count + per_step - 1) / per_step : 1; }

static int run_group(coll *a, shm_comm *s) {
  fsdp_comm *c = a->c;
  int n = c->size, me = c->rank;
  size_t es = fsdp_dtype_size(a->dtype);
  op_desc mine = {++s->seq, a->count, a->kind, a->dtype, a->out_dtype, a->op, a->root, 0};
  s->hdr->desc[me][mine.seq & 1] = mine;
  const char *what = op_names[a->kind];

  size_t per_step; /* elements of count moved per step */
  if (a->kind == OP_REDUCE_SCATTER)
    per_step = s->hdr->chunk / (es * (size_t)n);
  else
    per_step = s->hdr->chunk / es;
  int copy = a->kind == OP_SHIFT && a->root == 0; /* still met and checked: every member calls it */
  size_t steps = a->kind == OP_BARRIER || copy ? 1 : nsteps(a->count, per_step);

  for (size_t st = 0; st < steps; st++) {
    uint64_t h = s->step++ & 1;
    size_t off = st * per_step;
    size_t len = a->count - off < per_step ? a->count - off : per_step;
    if (a->kind == OP_BARRIER || a->count == 0 || copy) len = 0;
    char *mys = slot(s, me, h);
    /* write */
    if (a->kind == OP_ALL_GATHER || a->kind == OP_ALL_REDUCE || a->kind == OP_SHIFT) {
      memcpy(mys, (const char *)a->in + off * es, len * es);
    } else if (a->kind == OP_REDUCE_SCATTER) {
      for (int j = 0; j < n; j++)
        memcpy(mys + (size_t)j * per_step * es, (const char *)a->in + ((size_t)j * a->count + off) * es, len * es);
    } else if (a->kind == OP_BROADCAST && me == a->root) {
      memcpy(mys, (const char *)a->out + off * es, len * es);
    }
    FSDP_CHECK(step_barrier(c, s, what));
    if (st == 0) FSDP_CHECK(check_descriptors(c, s, &mine));
    /* read */
    if (a->kind == OP_ALL_GATHER) {
      for (int j = 0; j < n; j++)
        memmove((char *)a->out + ((size_t)j * a->count + off) * es, slot(s, j, h), len * es);
    } else if (a->kind == OP_REDUCE_SCATTER) {
      reduce_members(s, h, (size_t)me * per_step * es, a->dtype, a->out, a->out_dtype, off, len, a->op);
    } else if (a->kind == OP_BROADCAST && me != a->root) {
      memcpy((char *)a->out + off * es, slot(s, a->root, h), len * es);
    } else if (a->kind == OP_SHIFT) {
      memcpy((char *)a->out + off * es, slot(s, (me - a->root + n) % n, h), len * es);
    } else if (a->kind == OP_ALL_REDUCE) {
      size_t part = (len + (size_t)n - 1) / (size_t)n;
      size_t lo = (size_t)me * part < len ? (size_t)me * part : len;
      size_t hi = lo + part < len ? lo + part : len;
      if (hi > lo) reduce_members(s, h, lo * es, a->dtype, mys, a->dtype, lo, hi - lo, a->op);
      FSDP_CHECK(step_barrier(c, s, what));
      for (int j = 0; j < n; j++) {
        size_t jlo = (size_t)j * part < len ? (size_t)j * part : len;
        size_t jhi = jlo + part < len ? jlo + part : len;
        memcpy((char *)a->out + (off + jlo) * es, slot(s, j, h) + jlo * es, (jhi - jlo) * es);
      }
    }
  }
  if (copy) memcpy(a->out, a->in, a->count * es);
  return FSDP_OK;
}

/* A group of one: the collectives are copies (and conversions). */
static int run_single(coll *a, shm_comm *s) {
  size_t es = fsdp_dtype_size(a->dtype);
  switch (a->kind) {
    case OP_ALL_GATHER:
      memmove(a->out, a->in, a->count * es);
      return FSDP_OK;
    case OP_SHIFT: /* to and from itself (comm.c refused overlap) */
      memcpy(a->out, a->in, a->count * es);
      return FSDP_OK;
    case OP_REDUCE_SCATTER:
    case OP_ALL_REDUCE:
      /* avg over one member is the identity; conversion rounds like n > 1 */
      return fsdp_convert(a->out, a->kind == OP_REDUCE_SCATTER ? a->out_dtype : a->dtype, a->in, a->dtype,
                          a->count);
    default: return FSDP_OK;
  }
}

static int coll_task(void *arg) {
  coll *a = arg;
  shm_comm *s = a->c->impl;
  fsdp_heartbeat_pulse(); /* a collective reached is progress, even one that never waits */
  int rc = s->hdr ? run_group(a, s) : run_single(a, s);
  if (rc < 0 && s->hdr) mark_failed(s, fsdp_last_error());
  return rc;
}

static int enqueue(fsdp_comm *c, int kind, void *out, const void *in, size_t count, int dtype, int out_dtype,
                   int op, int root) {
  coll *a = malloc(sizeof *a);
  if (!a) return fsdp_fail(FSDP_ENOMEM, "comm '%s': out of memory", c->name);
  *a = (coll){c, kind, dtype, out_dtype, op, root, out, in, count};
  int rc = fsdp_cpu_stream_enqueue(c->stream, coll_task, a, free);
  return rc < 0 ? fsdp_fail_context(rc, "comm '%s': %s not started, the group failed earlier", c->name,
                                    op_names[kind])
                : FSDP_OK;
}

static int shm_all_gather(fsdp_comm *c, void *out, const void *in, size_t count, int dtype) {
  return enqueue(c, OP_ALL_GATHER, out, in, count, dtype, dtype, FSDP_SUM, 0);
}
static int shm_reduce_scatter(fsdp_comm *c, void *out, int out_dtype, const void *in, int in_dtype, size_t count,
                              int op) {
  return enqueue(c, OP_REDUCE_SCATTER, out, in, count, in_dtype, out_dtype, op, 0);
}
static int shm_all_reduce(fsdp_comm *c, void *out, const void *in, size_t count, int dtype, int op) {
  return enqueue(c, OP_ALL_REDUCE, out, in, count, dtype, dtype, op, 0);
}
static int shm_broadcast(fsdp_comm *c, void *buf, size_t count, int dtype, int root) {
  return enqueue(c, OP_BROADCAST, buf, buf, count, dtype, dtype, FSDP_SUM, root);
}
static int shm_shift(fsdp_comm *c, void *out, const void *in, size_t count, int dtype, int dist) {
  return enqueue(c, OP_SHIFT, out, in, count, dtype, dtype, FSDP_SUM, dist);
}
static int shm_barrier_op(fsdp_comm *c) { return enqueue(c, OP_BARRIER, NULL, NULL, 0, FSDP_FP32, FSDP_FP32, 0, 0); }

static void shm_destroy(fsdp_comm *c) {
  shm_comm *s = c->impl;
  if (c->stream) fsdp_stream_destroy(c->stream); /* drains pending work */
  if (s) {
    if (s->hdr) munmap(s->hdr, s->map_bytes);
    free(s->acc);
    free(s);
  }
}

static const comm_ops shm_ops = {.transport = "shm",
                                 .all_gather = shm_all_gather,
                                 .reduce_scatter = shm_reduce_scatter,
                                 .all_reduce = shm_all_reduce,
                                 .broadcast = shm_broadcast,
                                 .shift = shm_shift,
                                 .barrier = shm_barrier_op,
                                 .destroy = shm_destroy};

/* ---- creation ---- */

static size_t chunk_bytes(void) {
  const char *v = getenv("FSDP_SHM_CHUNK");
  size_t b = v ? (size_t)strtoull(v, NULL, 10) : 0;
  if (b < 4096) b = 2u << 20;
  return (b + 4095) & ~(size_t)4095;
}

static int open_group(fsdp_comm *c, shm_comm *s, const comm_group_spec *spec) {
  size_t chunk = chunk_bytes();
  int n = spec->size;
  s->map_bytes = SHM_DATA_OFFSET + (size_t)n * 2 * chunk;
  char key[256], segname[256] = "";
  snprintf(key, sizeof key, "fsdp.shm.%s", spec->tag);
  int leader = spec->my_index == 0;
  /* Every member reads the same host list, so on several hosts all of them
   * fail here at once (another host's /dev/shm is not this one's). */
  int rc = fsdp_hosts_check_one(spec->name, spec->members, n);
  int me = spec->members[spec->my_index];
  if (rc == FSDP_OK && leader) {
    shm_segment_name(segname, sizeof segname, spec->tag);
    rc = shm_segment_map(segname, 1, s->map_bytes, (void **)&s->hdr);
    if (rc == FSDP_OK) {
      shm_segment_test_die(me, "created");
      s->hdr->magic = SHM_MAGIC;
      s->hdr->n = (uint32_t)n;
      s->hdr->chunk = chunk;
      rc = fsdp_kv_put(key, segname, strlen(segname) + 1);
    }
  }
  /* Every rank of the world fences the same number of times per group
   * creation (two), even when its own step failed, so that the others are
   * not left waiting. */
  int frc = fsdp_kv_fence(0);
  if (frc < 0) {
    if (leader && s->hdr) shm_unlink(segname);
    return rc < 0 ? rc : frc;
  }
  if (rc == FSDP_OK && !leader) {
    size_t len = 0;
    rc = fsdp_kv_get(spec->members[0], key, segname, sizeof segname, &len);
    if (rc < 0) segname[0] = 0;
    segname[sizeof segname - 1] = 0;
    if (rc == FSDP_OK) rc = shm_segment_map(segname, 0, s->map_bytes, (void **)&s->hdr);
    if (rc == FSDP_OK && (s->hdr->magic != SHM_MAGIC || s->hdr->n != (uint32_t)n || s->hdr->chunk != chunk))
      rc = fsdp_fail(FSDP_ECOMM,
                     "shared memory '%s' does not match this group (members %u vs %d, chunk %llu vs %zu: is "
                     "FSDP_SHM_CHUNK the same on every rank?)",
                     segname, s->hdr->n, n, (unsigned long long)s->hdr->chunk, chunk);
  }
  if (s->hdr) shm_segment_test_die(me, "mapped");
  rc = fsdp_comm_joined_everywhere(spec, key, rc);
  /* Everyone has it mapped, or the creation failed: the name is not needed
   * any more. Every member that knows it removes it (ENOENT: another did),
   * so a leader that died since creating it leaves nothing behind. */
  if (segname[0]) shm_unlink(segname);
  if (rc < 0) return rc;
  atomic_store(&s->hdr->pids[spec->my_index], (int32_t)getpid());
  return step_barrier(c, s, "group creation");
}

int fsdp_comm_shm_create(const comm_group_spec *spec, fsdp_comm **out) {
  *out = NULL;
  if (spec->size > SHM_MAX_MEMBERS)
    return fsdp_fail(FSDP_EUNSUPPORTED, "comm '%s': %d members; the shared-memory transport supports %d",
                     spec->name, spec->size, SHM_MAX_MEMBERS);
  fsdp_comm *c = calloc(1, sizeof *c);
  shm_comm *s = calloc(1, sizeof *s);
  if (!c || !s) {
    free(c);
    free(s);
    return fsdp_fail(FSDP_ENOMEM, "comm '%s': out of memory", spec->name);
  }
  c->impl = s;
  int rc = fsdp_comm_init_common(c, spec, FSDP_CPU, &shm_ops);
  if (rc == FSDP_OK) {
    if (spec->size > 1) {
      rc = open_group(c, s, spec);
    } else {
      rc = fsdp_kv_fence(0); /* keep the world's fences in step: two, as open_group */
      if (rc == FSDP_OK) rc = fsdp_kv_fence(0);
    }
  }
  if (rc == FSDP_OK && s->hdr) {
    s->acc = malloc(4096 * sizeof(float));
    if (!s->acc) rc = fsdp_fail(FSDP_ENOMEM, "comm '%s': out of memory", spec->name);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    s->spin = cpus > 0 && spec->size < cpus ? 2000 : 0; /* oversubscribed: sleep at once */
  }
  if (rc == FSDP_OK) rc = fsdp_cpu_stream_create(&c->stream);
  if (rc < 0) {
    int keep = rc;
    fsdp_comm_free(c);
    return keep;
  }
  *out = c;
  return FSDP_OK;
}
