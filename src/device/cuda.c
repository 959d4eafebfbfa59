/* cuda.c: the CUDA device backend: memory, pinned host memory, non-blocking
 * streams, events without timing, copies. Every CUDA error becomes
 * FSDP_EDEVICE with the call, the CUDA message, file and line.
 *
 * Device memory comes from cudaMalloc, behind the caching pool of
 * caching_allocator.c (fsdp_alloc): activations and scratch are freed and
 * reallocated every step, and a cudaFree synchronises the whole device.
 * Leaks stay visible in the pool's statistics. Short-lived buffers that
 * follow a stream (the NCCL transport's fp32 staging) use cudaMallocAsync
 * on the device's default pool; when cudaMalloc runs out, that pool is
 * trimmed and the allocation retried once.
 *
 * s == NULL means synchronous: the work goes on the legacy default stream
 * and is waited for, since cudaMemcpy D2D, H2D from pageable memory and
 * cudaMemset may return before the device has finished them. */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "../../kernels/kernels.h"
#include "../base/error.h"
#include "../fsdp_device.h"
#include "cuda_impl.h"

static int cuda_check(cudaError_t e, const char *call, const char *file, int line) {
  if (e == cudaSuccess) return FSDP_OK;
  cudaGetLastError(); /* clear the sticky-free error so later calls are not blamed */
  return fsdp_fail(FSDP_EDEVICE, "%s: %s (%s:%d)", call, cudaGetErrorString(e), file, line);
}
#define CU(call) cuda_check((call), #call, __FILE__, __LINE__)

typedef struct cuda_stream {
  struct fsdp_stream base;
  cudaStream_t s;
} cuda_stream;

typedef struct cuda_event {
  struct fsdp_event base;
  cudaEvent_t e;
  int timed; /* created for fsdp_event_elapsed */
} cuda_event;

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static int probe_count;
static char probe_reason[256];

static void probe(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    snprintf(probe_reason, sizeof probe_reason, "no usable CUDA device: %s", cudaGetErrorString(e));
    cudaGetLastError();
    n = 0;
  } else if (n == 0) {
    snprintf(probe_reason, sizeof probe_reason, "no CUDA device is visible");
  }
  probe_count = n;
}

int fsdp_cuda_available(void) {
  pthread_once(&probe_once, probe);
  if (!probe_count) fsdp_fail(FSDP_EUNSUPPORTED, "%s", probe_reason);
  return probe_count > 0;
}

int fsdp_cuda_device_count(void) {
  pthread_once(&probe_once, probe);
  return probe_count;
}

int fsdp_cuda_set_device(int index) {
  if (index < 0 || index >= fsdp_cuda_device_count())
    return fsdp_fail(FSDP_EINVAL, "device_set: GPU %d out of range [0, %d)", index, fsdp_cuda_device_count());
  return CU(cudaSetDevice(index));
}

/* Gives the unused memory cached by the default stream-ordered pool back to
 * the device; 1 when there was a pool to trim. */
static int trim_default_pool(void) {
  int dev = 0;
  cudaMemPool_t pool;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetDefaultMemPool(&pool, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  if (cudaMemPoolTrimTo(pool, 0) == cudaSuccess) return 1;
  cudaGetLastError();
  return 0;
}

int fsdp_cuda_alloc(size_t bytes, void **out) {
  if (!bytes) bytes = 1;
  cudaError_t e = cudaMalloc(out, bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    if (trim_default_pool()) {
      e = cudaMalloc(out, bytes);
      if (e != cudaErrorMemoryAllocation) return CU(e);
      cudaGetLastError();
    }
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    return fsdp_fail(FSDP_ENOMEM, "alloc: %zu bytes on the GPU failed (%zu of %zu bytes free)", bytes, free_b, total);
  }
  return CU(e);
}

int fsdp_cuda_free(void *ptr) { return CU(cudaFree(ptr)); }

int fsdp_cuda_mem_info(int64_t *free_bytes, int64_t *total) {
  size_t f = 0, t = 0;
  FSDP_CHECK(CU(cudaMemGetInfo(&f, &t)));
  *free_bytes = (int64_t)f;
  *total = (int64_t)t;
  return FSDP_OK;
}

int fsdp_cuda_device_name(char *buf, size_t size) {
  int dev = 0;
  struct cudaDeviceProp prop;
  FSDP_CHECK(CU(cudaGetDevice(&dev)));
  FSDP_CHECK(CU(cudaGetDeviceProperties(&prop, dev)));
  snprintf(buf, size, "%s", prop.name);
  return FSDP_OK;
}

int fsdp_cuda_alloc_host_pinned(size_t bytes, void **out) {
  cudaError_t e = cudaMallocHost(out, bytes ? bytes : 1);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return fsdp_fail(FSDP_ENOMEM, "alloc_host_pinned: %zu bytes failed", bytes);
  }
  return CU(e);
}

int fsdp_cuda_free_host_pinned(void *ptr) { return ptr ? CU(cudaFreeHost(ptr)) : FSDP_OK; }

int fsdp_cuda_stream_create(fsdp_stream **out) {
  cuda_stream *s = calloc(1, sizeof *s);
  if (!s) return fsdp_fail(FSDP_ENOMEM, "stream_create: out of memory");
  s->base.device = FSDP_CUDA;
  int rc = CU(cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking));
  if (rc < 0) {
    free(s);
    return rc;
  }
  *out = &s->base;
  return FSDP_OK;
}

static int guarded_wait(cudaStream_t s, cudaEvent_t e, const char *what);

int fsdp_cuda_stream_destroy(fsdp_stream *base) {
  cuda_stream *s = (cuda_stream *)base;
  int rc = guarded_wait(s->s, NULL, "a CUDA stream's last work before it is destroyed");
  cudaStreamDestroy(s->s);
  free(s);
  return rc;
}

void *fsdp_cuda_stream_handle(fsdp_stream *base) { return base ? (void *)((cuda_stream *)base)->s : NULL; }

static cudaStream_t handle(fsdp_stream *base) { return base ? ((cuda_stream *)base)->s : (cudaStream_t)0; }

/* ---- waits a dead peer could make endless ----
 * While NCCL communicators are alive, a stream or an event may wait behind
 * a collective that a dead peer never joins (the compute stream waits on a
 * gather's event; evaluation reads a loss; a gather reads a parameter).
 * Then a wait polls and asks the guard the NCCL transport installed
 * (comm_nccl.c: a peer left, an NCCL error, the comm timeout), which aborts
 * the communicators and fails the wait naming why. Without one: CUDA's own
 * blocking wait. */
static int (*wait_guard)(const char *what, double waited_s);

void fsdp_cuda_set_wait_guard(int (*guard)(const char *what, double waited_s)) { wait_guard = guard; }

static int guarded_wait(cudaStream_t s, cudaEvent_t e, const char *what) {
  if (!wait_guard) return CU(e ? cudaEventSynchronize(e) : cudaStreamSynchronize(s));
  double start = fsdp_time_now();
  for (;;) {
    cudaError_t r = e ? cudaEventQuery(e) : cudaStreamQuery(s);
    if (r == cudaSuccess) return FSDP_OK;
    if (r != cudaErrorNotReady) return CU(r);
    cudaGetLastError(); /* as event_query: a "not ready" left as the last error fails the next launch's check */
    double waited = fsdp_time_now() - start;
    FSDP_CHECK(wait_guard(what, waited));
    if (waited > 1e-3) usleep(50); /* spin the first millisecond: short waits stay short */
  }
}

int fsdp_cuda_stream_synchronize(fsdp_stream *s) { return guarded_wait(handle(s), NULL, "a CUDA stream"); }

int fsdp_cuda_stream_wait_event(fsdp_stream *s, fsdp_event *e) {
  return CU(cudaStreamWaitEvent(handle(s), ((cuda_event *)e)->e, 0));
}

int fsdp_cuda_stream_delay(fsdp_stream *s, int64_t microseconds) {
  return CU((cudaError_t)fsdp_kernel_delay(microseconds, handle(s)));
}

static int create_event(fsdp_event **out, int timed) {
  cuda_event *e = calloc(1, sizeof *e);
  if (!e) return fsdp_fail(FSDP_ENOMEM, "event_create: out of memory");
  e->base.device = FSDP_CUDA;
  e->timed = timed;
  /* events only for ordering skip the timestamp (cheaper to record) */
  int rc = CU(cudaEventCreateWithFlags(&e->e, timed ? cudaEventDefault : cudaEventDisableTiming));
  if (rc < 0) {
    free(e);
    return rc;
  }
  *out = &e->base;
  return FSDP_OK;
}

int fsdp_cuda_event_create(fsdp_event **out) { return create_event(out, 0); }
int fsdp_cuda_event_create_timed(fsdp_event **out) { return create_event(out, 1); }

int fsdp_cuda_event_elapsed(fsdp_event *a, fsdp_event *b, double *seconds) {
  cuda_event *x = (cuda_event *)a, *y = (cuda_event *)b;
  if (!x->timed || !y->timed) return fsdp_fail(FSDP_EINVAL, "event_elapsed: an event not created timed");
  float ms = 0;
  cudaError_t e = cudaEventElapsedTime(&ms, x->e, y->e);
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    return fsdp_fail(FSDP_EINVAL, "event_elapsed: an event has not completed (synchronize first)");
  }
  FSDP_CHECK(CU(e));
  *seconds = ms * 1e-3;
  return FSDP_OK;
}

int fsdp_cuda_event_destroy(fsdp_event *base) {
  cuda_event *e = (cuda_event *)base;
  int rc = CU(cudaEventDestroy(e->e));
  free(e);
  return rc;
}

/* s == NULL records on the default stream. */
int fsdp_cuda_event_record(fsdp_event *e, fsdp_stream *s) {
  return CU(cudaEventRecord(((cuda_event *)e)->e, handle(s)));
}

int fsdp_cuda_event_query(fsdp_event *base) {
  cudaError_t e = cudaEventQuery(((cuda_event *)base)->e);
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    return 0;
  }
  return e == cudaSuccess ? 1 : CU(e);
}

int fsdp_cuda_event_synchronize(fsdp_event *e) { return guarded_wait(NULL, ((cuda_event *)e)->e, "a CUDA event"); }

int fsdp_cuda_memcpy(void *dst, const void *src, size_t bytes, fsdp_stream *s) {
  FSDP_CHECK(CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, handle(s))));
  return s ? FSDP_OK : guarded_wait(0, NULL, "a copy on the default stream");
}

int fsdp_cuda_memset(void *dst, int value, size_t bytes, fsdp_stream *s) {
  FSDP_CHECK(CU(cudaMemsetAsync(dst, value, bytes, handle(s))));
  return s ? FSDP_OK : guarded_wait(0, NULL, "a copy on the default stream");
}

int fsdp_cuda_is_pinned_ptr(const void *ptr) {
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return a.type == cudaMemoryTypeHost;
}

int fsdp_cuda_is_device_ptr(const void *ptr) {
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}
