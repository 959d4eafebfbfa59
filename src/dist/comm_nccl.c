/* comm_nccl.c: collectives between GPU ranks through NCCL, one communicator
 * per group, each on its own CUDA stream.
 *
 * Bootstrap: the group's leader makes an NCCL unique id and publishes it
 * through the PMIx fence (the same rendezvous as the shared-memory
 * transport), the members read it and join with ncclCommInitRank.
 * bf16/fp16 in with fp32 out (fp32 accumulation) casts into a stream-ordered
 * fp32 block and reduce-scatters that, chunk by chunk (comm_cast_chunks.c):
 * NCCL reduces in its input type.
 * Waits are bounded: synchronize polls the stream and NCCL's asynchronous
 * error, and aborts the communicator after the comm's timeout instead of
 * hanging on a dead peer (so does destroy, through synchronize); after an
 * abort nothing reaches NCCL with that communicator. Not bounded:
 * ncclCommInitRank itself, which waits for every member; just before it
 * every member says through one more fence whether it got this far
 * (fsdp_comm_joined_everywhere), so that one that failed (no GPU, no id)
 * makes all fail, named, instead of leaving them in it. */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../kernels/kernels.h"
#include "../base/error.h"
#include "../base/heartbeat.h"
#include "../device/cuda_impl.h"
#include "../fsdp_dist.h"
#include "comm_impl.h"
#include "shm_sync.h"

typedef struct nccl_comm {
  ncclComm_t comm;
  int *scratch; /* device int for the barrier */
  int aborted;
  struct nccl_comm *next; /* this rank's live communicators (abort_all) */
} nccl_comm;

/* Every communicator of this rank: when one fails, the others (channel 1,
 * HSDP's outer group) would spin on the same dead peer for ever. */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static nccl_comm *live_comms;

static int device_wait_guard(const char *what, double waited_s);

/* (and the device's waits are guarded while any communicator lives) */
static void track(nccl_comm *nc, int on) {
  pthread_mutex_lock(&live_lock);
  nccl_comm **p = &live_comms;
  while (*p && *p != nc) p = &(*p)->next;
  if (on && !*p) {
    nc->next = live_comms;
    live_comms = nc;
  } else if (!on && *p) {
    *p = nc->next;
  }
  fsdp_cuda_set_wait_guard(live_comms ? device_wait_guard : NULL);
  pthread_mutex_unlock(&live_lock);
}

/* After ncclCommAbort nothing may reach NCCL with that communicator. */
static void abort_all(void) {
  pthread_mutex_lock(&live_lock);
  for (nccl_comm *nc = live_comms; nc; nc = nc->next)
    if (nc->comm && !nc->aborted) {
      ncclCommAbort(nc->comm);
      nc->comm = NULL;
      nc->aborted = 1;
    }
  pthread_mutex_unlock(&live_lock);
}

static int nccl_check(ncclResult_t r, ncclComm_t comm, const char *call, const char *name) {
  if (r == ncclSuccess || r == ncclInProgress) return FSDP_OK;
  const char *detail = comm ? ncclGetLastError(comm) : ncclGetLastError(NULL);
  int shared = detail && strstr(detail, "Duplicate GPU");
  return fsdp_fail(FSDP_ECOMM, "comm '%s': %s: %s%s%s%s", name, call, ncclGetErrorString(r),
                   detail && detail[0] ? ": " : "", detail ? detail : "",
                   shared ? " (ranks of one node share a GPU: start one rank per GPU, or test with fsdprun "
                            "--ranks-per-gpu N)"
                          : "");
}
#define NC(c, call) nccl_check((call), ((nccl_comm *)(c)->impl)->comm, #call, (c)->name)

/* after ncclCommAbort the ncclComm_t is gone: nothing may reach NCCL with it
 * (a collective issued after a timeout, a deregistration at teardown) */
static int live(fsdp_comm *c) {
  if (((nccl_comm *)c->impl)->aborted)
    return fsdp_fail(FSDP_ECOMM, "comm '%s': not issued: the communicator was aborted after an earlier failure", c->name);
  return FSDP_OK;
}

static ncclDataType_t nccl_type(int dtype) {
  return dtype == FSDP_BF16 ? ncclBfloat16 : dtype == FSDP_FP16 ? ncclFloat16 : ncclFloat32;
}

static ncclRedOp_t nccl_op(int op) { return op == FSDP_AVG ? ncclAvg : ncclSum; }

static cudaStream_t stream_of(fsdp_comm *c) { return (cudaStream_t)fsdp_cuda_stream_handle(c->stream); }

static ncclComm_t comm_of(fsdp_comm *c) { return ((nccl_comm *)c->impl)->comm; }

static int cuda_fail(cudaError_t e, fsdp_comm *c, const char *what) {
  cudaGetLastError();
  return fsdp_fail(FSDP_EDEVICE, "comm '%s': %s: %s", c->name, what, cudaGetErrorString(e));
}

static int nccl_all_gather(fsdp_comm *c, void *out, const void *in, size_t count, int dtype) {
  FSDP_CHECK(live(c));
  return NC(c, ncclAllGather(in, out, count, nccl_type(dtype), comm_of(c), stream_of(c)));
}

/* the two steps of a chunked bf16/fp16 -> fp32 reduce-scatter (comm_cast_chunks.c) */
typedef struct cast_ctx {
  fsdp_comm *c;
  int in_dtype, op;
} cast_ctx;

static int cast_rows_step(void *ctx, float *dst, const void *src, size_t rows, size_t cols, size_t src_stride) {
  cast_ctx *x = ctx;
  cudaError_t e = (cudaError_t)fsdp_kernel_cast_rows_to_f32(dst, src, x->in_dtype, rows, cols, src_stride, stream_of(x->c));
  return e == cudaSuccess ? FSDP_OK : cuda_fail(e, x->c, "cast to fp32");
}

static int reduce_scatter_step(void *ctx, float *out, const float *in, size_t count) {
  cast_ctx *x = ctx;
  return NC(x->c, ncclReduceScatter(in, out, count, ncclFloat32, nccl_op(x->op), comm_of(x->c), stream_of(x->c)));
}

static int nccl_reduce_scatter(fsdp_comm *c, void *out, int out_dtype, const void *in, int in_dtype, size_t count,
                               int op) {
  FSDP_CHECK(live(c));
  if (in_dtype == out_dtype)
    return NC(c, ncclReduceScatter(in, out, count, nccl_type(in_dtype), nccl_op(op), comm_of(c), stream_of(c)));
  /* NCCL reduces in its input type: fp32 sums need an fp32 input, cast in
   * chunks through a bounded block (the device's pool keeps it) */
  const size_t chunk = fsdp_comm_cast_chunk(count, c->size);
  float *tmp = NULL;
  cudaError_t e = cudaMallocAsync((void **)&tmp, chunk * (size_t)c->size * sizeof(float) + 1, stream_of(c));
  if (e != cudaSuccess) return cuda_fail(e, c, "fp32 staging block for the reduce-scatter");
  cast_ctx x = {c, in_dtype, op};
  const comm_cast_steps steps = {&x, cast_rows_step, reduce_scatter_step};
  int rc = fsdp_comm_cast_reduce_scatter(count, c->size, chunk, fsdp_dtype_size((fsdp_dtype)in_dtype), tmp, out, in,
                                         &steps);
  cudaFreeAsync(tmp, stream_of(c)); /* stream-ordered: freed after the collectives */
  return rc;
}

static int nccl_all_reduce(fsdp_comm *c, void *out, const void *in, size_t count, int dtype, int op) {
  FSDP_CHECK(live(c));
  return NC(c, ncclAllReduce(in, out, count, nccl_type(dtype), nccl_op(op), comm_of(c), stream_of(c)));
}

static int nccl_broadcast(fsdp_comm *c, void *buf, size_t count, int dtype, int root) {
  FSDP_CHECK(live(c));
  return NC(c, ncclBroadcast(buf, buf, count, nccl_type(dtype), root, comm_of(c), stream_of(c)));
}

/* A send to the next member and a receive from the previous, fused in one
 * group so that no member's send waits for its receive (a ring of blocking
 * pairs would deadlock). dist 0 (and a group of one): a copy on the stream. */
static int nccl_shift(fsdp_comm *c, void *out, const void *in, size_t count, int dtype, int dist) {
  FSDP_CHECK(live(c));
  int n = c->size, me = c->rank;
  if (dist == 0) {
    cudaError_t e = cudaMemcpyAsync(out, in, count * fsdp_dtype_size((fsdp_dtype)dtype), cudaMemcpyDeviceToDevice,
                                    stream_of(c));
    return e == cudaSuccess ? FSDP_OK : cuda_fail(e, c, "shift (a copy)");
  }
  ncclDataType_t t = nccl_type(dtype);
  FSDP_CHECK(NC(c, ncclGroupStart()));
  int rc = NC(c, ncclSend(in, count, t, (me + dist) % n, comm_of(c), stream_of(c)));
  if (rc == FSDP_OK) rc = NC(c, ncclRecv(out, count, t, (me - dist + n) % n, comm_of(c), stream_of(c)));
  if (rc < 0) {
    ncclGroupEnd(); /* closed even after a failure inside (the group depth is per thread); rc says why */
    return rc;
  }
  return NC(c, ncclGroupEnd());
}

static int nccl_barrier(fsdp_comm *c) {
  FSDP_CHECK(live(c));
  nccl_comm *nc = c->impl;
  return NC(c, ncclAllReduce(nc->scratch, nc->scratch, 1, ncclInt32, ncclSum, nc->comm, stream_of(c)));
}

/* Poll instead of cudaStreamSynchronize, which would wait forever for a
 * peer that never joins the collective. */
static int nccl_synchronize(fsdp_comm *c) {
  nccl_comm *nc = c->impl;
  if (nc->aborted) return fsdp_fail(FSDP_ECOMM, "comm '%s': aborted after an earlier failure", c->name);
  double start = shm_now(), deadline = start + c->timeout_s;
  fsdp_heartbeat_pulse(); /* reaching a collective's end is progress, even without a wait */
  for (;;) {
    cudaError_t e = cudaStreamQuery(stream_of(c));
    if (e == cudaSuccess) return FSDP_OK;
    if (e != cudaErrorNotReady) return cuda_fail(e, c, "waiting for the comm's stream");
    cudaGetLastError(); /* a "not ready" left as the last error would fail the next launch's check */
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(nc->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      int rc = nccl_check(async, nc->comm, "asynchronous error", c->name);
      abort_all();
      return rc;
    }
    /* PMIx says a rank ended: within a node NCCL raises no error for a
     * dead peer, and its collectives will never come */
    int gone = fsdp_peer_left();
    if (gone >= 0) {
      abort_all();
      return fsdp_fail(FSDP_ECOMM,
                       "comm '%s': rank %d left the job while this rank waited for the comm's collectives; every "
                       "NCCL communicator of this rank was aborted",
                       c->name, gone);
    }
    if (shm_now() > deadline) {
      abort_all();
      return fsdp_fail(FSDP_ETIMEOUT,
                       "comm '%s': collectives did not finish within %.0f s (a peer died or is calling collectives "
                       "in another order); the communicator was aborted", c->name, c->timeout_s);
    }
    fsdp_heartbeat_pulse(); /* waiting for a peer is not being stuck */
    if (shm_now() - start > 1e-3) usleep(50); /* spin the first millisecond: short waits stay short */
  }
}

/* A device wait (a stream, an event: cuda.c) asks this while it polls: a
 * rank that left the job, an NCCL error on any live communicator, or a wait
 * longer than the comm timeout end it, every communicator aborted, so the
 * stream behind the collective drains and the rank can exit (evaluation,
 * a gather to the host and teardown waited without a bound before). */
static int device_wait_guard(const char *what, double waited_s) {
  int gone = fsdp_peer_left();
  if (gone >= 0) {
    abort_all();
    return fsdp_fail(FSDP_ECOMM, "rank %d left the job while this rank waited for %s; every NCCL communicator of "
                     "this rank was aborted", gone, what);
  }
  ncclResult_t async = ncclSuccess;
  const char *bad = NULL;
  pthread_mutex_lock(&live_lock);
  for (nccl_comm *nc = live_comms; nc && !bad; nc = nc->next) {
    if (!nc->comm || nc->aborted) continue;
    ncclCommGetAsyncError(nc->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) bad = ncclGetErrorString(async);
  }
  pthread_mutex_unlock(&live_lock);
  if (bad) {
    abort_all();
    return fsdp_fail(FSDP_ECOMM, "an NCCL communicator failed (%s) while this rank waited for %s; every NCCL "
                     "communicator of this rank was aborted", bad, what);
  }
  double limit = fsdp_comm_default_timeout();
  if (waited_s > limit) {
    abort_all();
    return fsdp_fail(FSDP_ETIMEOUT, "%s did not finish within %.0f s (FSDP_COMM_TIMEOUT: work behind a collective a "
                     "peer never joined); every NCCL communicator of this rank was aborted", what, limit);
  }
  fsdp_heartbeat_pulse(); /* waiting for a peer is not being stuck */
  return FSDP_OK;
}

static void nccl_destroy(fsdp_comm *c) {
  nccl_comm *nc = c->impl;
  if (nc) {
    track(nc, 0);
    if (nc->comm) {
      if (!nc->aborted && nccl_synchronize(c) == FSDP_OK)
        ncclCommDestroy(nc->comm);
      else if (!nc->aborted)
        ncclCommAbort(nc->comm);
    }
    if (nc->scratch) cudaFree(nc->scratch);
    free(nc);
  }
  if (c->stream) fsdp_stream_destroy(c->stream);
}

/* The fp32 staging buffers come from the device's default stream-ordered
 * pool; by default it hands freed memory back at every synchronization, so
 * each step would map its staging memory anew. Keep it cached instead
 * (cuda.c trims the pool when cudaMalloc runs out). */
static void keep_pool_cache(void) {
  int dev = 0;
  cudaMemPool_t pool;
  uint64_t keep = UINT64_MAX;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetDefaultMemPool(&pool, dev) != cudaSuccess ||
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess)
    cudaGetLastError(); /* only a cache: no pool support is not an error */
}

/* ---- user-buffer registration (comm_register.c) ---- */

static int nccl_mem_alloc(fsdp_comm *c, size_t bytes, void **out) { return NC(c, ncclMemAlloc(out, bytes)); }

static void nccl_mem_free(fsdp_comm *c, void *p) {
  (void)c;
  ncclMemFree(p);
}

/* Symmetric windows arrived in NCCL 2.27; the library found at run time may
 * be older than the header, so they are looked up, not linked. */
typedef ncclResult_t (*window_register_fn)(ncclComm_t, void *, size_t, void **, int);
typedef ncclResult_t (*window_deregister_fn)(ncclComm_t, void *);

static int nccl_register(fsdp_comm *c, void *buf, size_t bytes, int mode, void **handle) {
  FSDP_CHECK(live(c));
  if (mode == FSDP_REG_BUFFER) return NC(c, ncclCommRegister(comm_of(c), buf, bytes, handle));
  window_register_fn reg = (window_register_fn)dlsym(RTLD_DEFAULT, "ncclCommWindowRegister");
  if (!reg)
    return fsdp_fail(FSDP_EUNSUPPORTED, "comm '%s': symmetric windows need NCCL 2.27 or newer (the NCCL loaded has no "
                     "ncclCommWindowRegister); use FSDP_REG_BUFFER", c->name);
  return nccl_check(reg(comm_of(c), buf, bytes, handle, 1 /* NCCL_WIN_COLL_SYMMETRIC */), comm_of(c),
                    "ncclCommWindowRegister", c->name);
}

static void nccl_deregister(fsdp_comm *c, void *handle, int mode) {
  if (((nccl_comm *)c->impl)->aborted) return; /* gone with the communicator */
  if (mode == FSDP_REG_BUFFER) {
    ncclCommDeregister(comm_of(c), handle);
    return;
  }
  window_deregister_fn dereg = (window_deregister_fn)dlsym(RTLD_DEFAULT, "ncclCommWindowDeregister");
  if (dereg) dereg(comm_of(c), handle);
}

static const comm_ops nccl_ops = {.transport = "nccl",
                                  .all_gather = nccl_all_gather,
                                  .reduce_scatter = nccl_reduce_scatter,
                                  .all_reduce = nccl_all_reduce,
                                  .broadcast = nccl_broadcast,
                                  .shift = nccl_shift,
                                  .barrier = nccl_barrier,
                                  .synchronize = nccl_synchronize,
                                  .destroy = nccl_destroy,
                                  .mem_alloc = nccl_mem_alloc,
                                  .mem_free = nccl_mem_free,
                                  .register_buffer = nccl_register,
                                  .deregister_buffer = nccl_deregister};

int fsdp_comm_nccl_create(const comm_group_spec *spec, fsdp_comm **out) {
  *out = NULL;
  fsdp_comm *c = calloc(1, sizeof *c);
  nccl_comm *nc = calloc(1, sizeof *nc);
  if (!c || !nc) {
    free(c);
    free(nc);
    return fsdp_fail(FSDP_ENOMEM, "comm '%s': out of memory", spec->name);
  }
  c->impl = nc;
  int rc = fsdp_comm_init_common(c, spec, FSDP_CUDA, &nccl_ops);
  char key[256];
  snprintf(key, sizeof key, "fsdp.nccl.%s", spec->tag);
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (rc == FSDP_OK && !fsdp_cuda_available()) rc = FSDP_EUNSUPPORTED; /* message set by the probe */
  /* Two or three communicators are live at once (the reductions' channel,
   * HSDP's outer group), fed from different streams: NCCL launches their
   * kernels in the host's order only when asked to, else two ranks may
   * start them in different orders and wait on each other for ever. A
   * user's own setting wins. */
  setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "1", 0);
  if (rc == FSDP_OK && spec->my_index == 0) {
    rc = nccl_check(ncclGetUniqueId(&id), NULL, "ncclGetUniqueId", spec->name);
    if (rc == FSDP_OK) rc = fsdp_kv_put(key, &id, sizeof id);
  }
  int frc = fsdp_kv_fence(0); /* every rank fences once per group, even after a local failure */
  if (rc == FSDP_OK) rc = frc;
  if (rc == FSDP_OK && spec->my_index != 0) {
    size_t len = 0;
    rc = fsdp_kv_get(spec->members[0], key, &id, sizeof id, &len);
    if (rc == FSDP_OK && len != sizeof id)
      rc = fsdp_fail(FSDP_ECOMM, "comm '%s': the NCCL id under '%s' from rank %d has %zu bytes, expected %zu",
                     spec->name, key, spec->members[0], len, sizeof id);
  }
  /* ncclCommInitRank waits for every member with no bound: a member that
   * failed above (no GPU, no id) would leave the others in it for ever.
   * One more world fence first, as the CPU transport does, so that all of
   * them fail at once, naming it. */
  rc = fsdp_comm_joined_everywhere(spec, key, rc);
  if (rc == FSDP_OK) rc = nccl_check(ncclCommInitRank(&nc->comm, spec->size, id, spec->my_index), NULL,
                                     "ncclCommInitRank", spec->name);
  if (rc == FSDP_OK) {
    cudaError_t e = cudaMalloc((void **)&nc->scratch, sizeof(int));
    if (e == cudaSuccess) e = cudaMemset(nc->scratch, 0, sizeof(int));
    if (e != cudaSuccess) rc = cuda_fail(e, c, "barrier scratch");
  }
  if (rc == FSDP_OK) track(nc, 1);
  if (rc == FSDP_OK) keep_pool_cache();
  if (rc == FSDP_OK) rc = fsdp_cuda_stream_create(&c->stream);
  if (rc < 0) {
    int keep = rc;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", fsdp_last_error());
    fsdp_comm_free(c);
    return fsdp_fail(keep, "%s", msg);
  }
  *out = c;
  return FSDP_OK;
}
