/* fsdp.h: the public API of the fsdp engine: this file and the per-layer
 * headers it includes at the end (fsdp_shard.h, fsdp_ops.h, fsdp_io.h).
 *
 * FFI-clean on purpose: no macros inside declarations, no bit-fields, no
 * varargs, so that lua/fsdp/ffi.lua can hand this file (preprocessor lines and
 * the __cplusplus block stripped) straight to ffi.cdef. tests/lua/test_ffi.lua
 * checks the Lua view against the C one.
 *
 * Conventions
 * - Every call that can fail returns int: 0 (FSDP_OK) or a negative FSDP_E*
 *   status; fsdp_last_error() then holds a message (thread-local). The library
 *   never exits or aborts on a caller's mistake.
 * - Handles are opaque; *_destroy(NULL) is a no-op.
 * - Asynchronous work is enqueued on a stream and ordered by events, with the
 *   same meaning on CPU and CUDA: an event wait captures the event's most
 *   recent record at the time of the wait; waiting on a never-recorded event
 *   does not block.
 */
#ifndef FSDP_H
#define FSDP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes ---------------------------------------------------- */
enum {
  FSDP_OK = 0,
  FSDP_EINVAL = -1,      /* a bad argument from the caller */
  FSDP_ENOMEM = -2,      /* host or device allocation failed */
  FSDP_EIO = -3,         /* file or OS error */
  FSDP_ECOMM = -4,       /* a collective failed or ranks disagree */
  FSDP_ETIMEOUT = -5,    /* a bounded wait ran out */
  FSDP_EPEER = -6,       /* a peer rank died */
  FSDP_EUNSUPPORTED = -7,/* not built in, or no such device */
  FSDP_EDEVICE = -8,     /* the device runtime reported an error */
  FSDP_ESTATE = -9,      /* call out of order (e.g. before fsdp_init) */
  FSDP_ELAUNCH = -10,    /* the launcher (PMIx) failed */
  FSDP_ECORRUPT = -11    /* a file's contents are malformed or damaged */
};

/* ---- dtypes, devices, reductions ------------------------------------- */
/* int32: token ids and targets (not for reductions) */
typedef enum { FSDP_FP32 = 0, FSDP_BF16 = 1, FSDP_FP16 = 2, FSDP_FP64 = 3, FSDP_INT32 = 4 } fsdp_dtype;
typedef enum { FSDP_CPU = 0, FSDP_CUDA = 1 } fsdp_device;
typedef enum { FSDP_SUM = 0, FSDP_AVG = 1 } fsdp_redop;
typedef enum { FSDP_LOG_ERROR = 0, FSDP_LOG_WARN = 1, FSDP_LOG_INFO = 2, FSDP_LOG_DEBUG = 3 } fsdp_log_level;

/* ---- base ------------------------------------------------------------ */
const char *fsdp_version(void);
const char *fsdp_last_error(void);
const char *fsdp_status_name(int status);
void fsdp_clear_error(void);
double fsdp_time_now(void);                /* monotonic seconds */
/* The stop signals (SIGTERM, SIGINT, SIGHUP, SIGUSR1) recorded instead of
 * acted on while watched (on = 1; on = 0 restores the previous handlers);
 * a second one acts at once. fsdp_stop_signal: the first one received
 * since watching began, 0 if none (src/base/stop_signal.c). */
int fsdp_stop_signals_watch(int on);
int fsdp_stop_signal(void);
const char *fsdp_signal_name(int sig);     /* "SIGTERM", ...; "a signal" for others */
/* Tells fsdprun this rank is alive and at `step` (< 0: the step is not
 * known); a no-op when fsdprun does not watch (src/base/heartbeat.h). */
int fsdp_heartbeat(int64_t step);
void fsdp_log_set_level(int level);
int fsdp_log_get_level(void);

size_t fsdp_dtype_size(int dtype);         /* 0 for an unknown dtype */
const char *fsdp_dtype_name(int dtype);    /* "?" for an unknown dtype */
int fsdp_dtype_from_name(const char *name); /* dtype, or FSDP_EINVAL */
float fsdp_bf16_to_f32(uint16_t h);
uint16_t fsdp_f32_to_bf16(float f);        /* round to nearest even; NaN kept */
float fsdp_fp16_to_f32(uint16_t h);
uint16_t fsdp_f32_to_fp16(float f);
/* Element-wise conversion between any two dtypes (CPU memory). */
int fsdp_convert(void *dst, int dst_dtype, const void *src, int src_dtype, size_t n);
/* dst[i] += src[i], any two dtypes, one rounding to dst's dtype (CPU memory). */
int fsdp_accumulate(void *dst, int dst_dtype, const void *src, int src_dtype, size_t n);
/* The index of the first NaN or infinity among x[0, n) (CPU memory), or -1:
 * one vectorised pass (src/base/scan.c). */
int64_t fsdp_find_nonfinite(const float *x, int64_t n);

/* ---- counter-based RNG (Philox-4x32-10) ------------------------------ */
typedef enum { FSDP_RNG_UNIFORM = 0, FSDP_RNG_NORMAL = 1 } fsdp_rng_dist;
void fsdp_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);
/* A stream id for a name (FNV-1a), e.g. a parameter's. */
uint32_t fsdp_rng_stream_id(const char *name);
/* dst[i] = draw(seed, stream, first_index + i) for i < n (CPU memory);
 * uniform on (a, b), or normal with mean a and std b. See philox.c. */
int fsdp_rng_fill(void *dst, int dtype, int64_t n, uint64_t seed, uint32_t stream, int64_t first_index, int dist,
                  double a, double b);

/* ---- process: boot, identity, key/value exchange ---------------------- */
typedef struct fsdp_proc_info {
  int32_t rank;        /* in the job */
  int32_t size;        /* ranks in the job */
  int32_t local_rank;  /* on this node */
  int32_t local_size;
  int32_t node_rank;   /* this rank's host among the job's distinct host names, sorted: 0..num_nodes-1 */
  int32_t num_nodes;   /* distinct hosts (PMIX_HOSTNAME) in the job */
  int32_t singleton;   /* 1: no launcher was found, world of one */
  int32_t device_count;/* CUDA devices visible; -1: not looked at (fsdp_init starts CUDA only
                          if it is in use already; fsdp_device_count(FSDP_CUDA) asks) */
  char nspace[256];    /* PMIx namespace of the job */
} fsdp_proc_info;

/* Connects to the launcher (PMIx client) or becomes a singleton. Idempotent. */
int fsdp_init(fsdp_proc_info *info);
int fsdp_finalize(void);
int fsdp_initialized(void);
/* Publish a key for the other ranks; visible after the next fsdp_kv_fence. */
int fsdp_kv_put(const char *key, const void *data, size_t len);
/* Commit and wait for every rank (collective); timeout_ms <= 0: default. */
int fsdp_kv_fence(int timeout_ms);
/* Read a key another rank published. *len is set to the full length. */
int fsdp_kv_get(int rank, const char *key, void *data, size_t cap, size_t *len);
/* Ask the launcher to end the whole job with this status. */
int fsdp_abort(int status, const char *message);

/* ---- device memory, streams, events ---------------------------------- */
typedef struct fsdp_stream fsdp_stream;
typedef struct fsdp_event fsdp_event;

int fsdp_device_available(int device);     /* 1 when usable here */
int fsdp_device_count(int device);
/* The CUDA backend (libfsdp_cuda.so: CUDA runtime, cuBLASLt, NCCL, cuDNN)
 * is opened the first time a CUDA device is asked for, never by CPU jobs.
 * Its path, opening it if needed; NULL where there is none (the reason in
 * fsdp_last_error()). Its public fsdp_cuda_* entry points (fsdp_ops.h) are
 * then found by name in the process (it is opened RTLD_GLOBAL). */
const char *fsdp_cuda_library(void);
int fsdp_device_set(int device, int index);/* CUDA: select the GPU */

int fsdp_alloc(int device, size_t bytes, void **out);   /* 256-byte aligned */
int fsdp_alloc_host_pinned(size_t bytes, void **out);
int fsdp_free(int device, void *ptr);
int fsdp_free_host_pinned(void *ptr);
/* fsdp_alloc serves each device from a caching pool (freed blocks are kept
 * by size class and reused; see src/device/caching_allocator.c).
 * allocated: bytes handed out and not freed, as requested; peak: its
 * high-water mark; reserved: bytes the pool holds from the device (in use,
 * rounded to the size class, plus cached); cached: the free part of that. */
typedef struct fsdp_memory_stats {
  int64_t allocated, peak, allocs, frees;
  int64_t reserved, peak_reserved, cached, cache_hits;
} fsdp_memory_stats;
int fsdp_memory_get_stats(int device, fsdp_memory_stats *out);
int fsdp_memory_reset_peak(int device);      /* both peaks := current */
int fsdp_memory_empty_cache(int device);     /* cached blocks back to the device */
/* What the device has: CPU: MemAvailable and MemTotal of /proc/meminfo
 * (the whole machine, shared by its ranks); CUDA: cudaMemGetInfo. The
 * pool's cached bytes are free to this process but not counted here. */
int fsdp_device_memory_info(int device, int64_t *free_bytes, int64_t *total);
/* The device's name into buf (size bytes, NUL-terminated, cut to fit):
 * CUDA: the current GPU's (cudaGetDeviceProperties: "NVIDIA H100 80GB
 * HBM3"), the key of the MFU's table of peaks; CPU: "cpu" (the trainer reads
 * /proc/cpuinfo for the CPU's own). */
int fsdp_device_name(int device, char *buf, int64_t size);

/* A contiguous tensor of one dtype on one device, 1 to 4-D; it owns its
 * memory (tensor_alloc) or views part of another (tensor_view). */
typedef struct fsdp_tensor {
  void *data;
  int32_t dtype, device, ndim, owns;
  int64_t shape[4]; /* unused dimensions are 1 */
} fsdp_tensor;
int fsdp_tensor_alloc(fsdp_tensor *t, int device, int dtype, int ndim, const int64_t *shape);
/* t = elements [offset, offset + numel(shape)) of base, reshaped; no copy. */
int fsdp_tensor_view(fsdp_tensor *t, const fsdp_tensor *base, int64_t offset, int ndim, const int64_t *shape);
int fsdp_tensor_free(fsdp_tensor *t); /* idempotent; a view frees nothing */
int64_t fsdp_tensor_numel(const fsdp_tensor *t);
size_t fsdp_tensor_nbytes(const fsdp_tensor *t);

/* A stream runs enqueued work in order. CPU: a worker thread. */
int fsdp_stream_create(int device, fsdp_stream **out);
int fsdp_stream_destroy(fsdp_stream *s);   /* waits for pending work */
int fsdp_stream_device(const fsdp_stream *s);
/* Wait for everything enqueued; reports the first asynchronous error. */
int fsdp_stream_synchronize(fsdp_stream *s);
/* The stream waits (without blocking the caller) for the event's last record.
 * s == NULL: the calling thread blocks instead. */
int fsdp_stream_wait_event(fsdp_stream *s, fsdp_event *e);
/* Enqueue a pause (testing aid for ordering and overlap). */
int fsdp_stream_delay(fsdp_stream *s, int64_t microseconds);

int fsdp_event_create(int device, fsdp_event **out);
int fsdp_event_destroy(fsdp_event *e);
/* Marks the point in s; s == NULL: completes now (host). */
int fsdp_event_record(fsdp_event *e, fsdp_stream *s);
int fsdp_event_query(fsdp_event *e);       /* 1 done, 0 pending, <0 error */
int fsdp_event_synchronize(fsdp_event *e);

/* Copies and fills; s == NULL: synchronous. */
int fsdp_memcpy(void *dst, const void *src, size_t bytes, fsdp_stream *s);
int fsdp_memset(void *dst, int value, size_t bytes, fsdp_stream *s);

/* ---- mesh and collectives -------------------------------------------- */
typedef struct fsdp_mesh fsdp_mesh;
typedef struct fsdp_comm fsdp_comm;

/* Collective over all ranks. names/sizes give the dimensions, outermost
 * first; one size may be -1 (the rest). Product must equal the world size.
 * device selects the transport: FSDP_CPU (shared memory) or FSDP_CUDA (NCCL). */
int fsdp_mesh_create(int ndims, const char *const *names, const int64_t *sizes,
                     int device, fsdp_mesh **out);
int fsdp_mesh_destroy(fsdp_mesh *m);
int fsdp_mesh_ndims(const fsdp_mesh *m);
const char *fsdp_mesh_dim_name(const fsdp_mesh *m, int dim);
int64_t fsdp_mesh_dim_size(const fsdp_mesh *m, int dim);
int fsdp_mesh_dim_index(const fsdp_mesh *m, const char *name); /* or FSDP_EINVAL */
int64_t fsdp_mesh_coord(const fsdp_mesh *m, int dim);          /* this rank's */
int fsdp_mesh_device(const fsdp_mesh *m);
/* The communicator of this rank's group along the named dimensions:
 * "dp_shard", "dp_outer,dp_shard" (flattened), or "" / "world" for all.
 * Collective over the whole mesh the first time a set is asked for (every
 * rank must ask for the same sets in the same order); later calls are local.
 * The mesh owns the comm. */
int fsdp_mesh_group(fsdp_mesh *m, const char *dims, fsdp_comm **out);
/* Another communicator over the same group's members (channel 1..7; 0 is
 * fsdp_mesh_group's): its own stream and, on GPUs, its own NCCL
 * communicator, so that collectives on two channels run at the same time
 * (FSDP reduces on channel 1 while it gathers on channel 0). Named like
 * the group with "#channel" appended. Collective like fsdp_mesh_group. */
int fsdp_mesh_group_channel(fsdp_mesh *m, const char *dims, int channel, fsdp_comm **out);
/* Human-readable description into buf (always NUL-terminated). */
int fsdp_mesh_describe(const fsdp_mesh *m, char *buf, size_t cap);

int fsdp_comm_rank(const fsdp_comm *c);
int fsdp_comm_size(const fsdp_comm *c);
int fsdp_comm_device(const fsdp_comm *c);
const char *fsdp_comm_name(const fsdp_comm *c);
/* Global rank of the comm's member at position i. */
int fsdp_comm_member(const fsdp_comm *c, int i);
/* The comm's own stream: every collective below is enqueued on it and
 * returns at once. Order it against other streams with events. */
fsdp_stream *fsdp_comm_stream(fsdp_comm *c);

/* out[r*count .. (r+1)*count) = in of member r.  in may alias its own slot. */
int fsdp_comm_all_gather(fsdp_comm *c, void *out, const void *in, size_t count, int dtype);
/* out = op over members of in[my*count .. (my+1)*count).
 * in_dtype == out_dtype, or bf16/fp16 in with fp32 out (fp32 accumulation). */
int fsdp_comm_reduce_scatter(fsdp_comm *c, void *out, int out_dtype, const void *in,
                             int in_dtype, size_t count, int op);
/* out = op over members of in (count elements); out may equal in. */
int fsdp_comm_all_reduce(fsdp_comm *c, void *out, const void *in, size_t count, int dtype,
                         int op);
int fsdp_comm_broadcast(fsdp_comm *c, void *buf, size_t count, int dtype, int root);
int fsdp_comm_barrier(fsdp_comm *c);
/* Wait for all enqueued collectives; returns the first failure, if any. */
int fsdp_comm_synchronize(fsdp_comm *c);
/* Seconds a collective may wait for its peers before failing (default 300,
 * or FSDP_COMM_TIMEOUT in the environment). */
int fsdp_comm_set_timeout(fsdp_comm *c, double seconds);
/* Bytes of the fp32 staging the FSDP units on this comm share (0: none). */
int64_t fsdp_comm_scratch_bytes(const fsdp_comm *c);

/* User-buffer registration (src/dist/comm_register.c), off unless asked
 * for. NCCL: FSDP_REG_BUFFER registers a buffer with ncclCommRegister
 * (zero-copy collectives over NVLink and, with buffers from
 * fsdp_comm_mem_alloc, NVLink SHARP on NVSwitch systems); FSDP_REG_WINDOW
 * makes it a symmetric window (ncclCommWindowRegister, NCCL 2.27+:
 * collective, every member registers the same size at the same time). The
 * CPU transport registers nothing and says so by a NULL handle inside. */
typedef enum { FSDP_REG_NONE = 0, FSDP_REG_BUFFER = 1, FSDP_REG_WINDOW = 2 } fsdp_comm_reg_mode;
typedef struct fsdp_comm_reg fsdp_comm_reg;
/* Memory for buffers that will be registered in `mode` (NCCL: ncclMemAlloc;
 * FSDP_REG_NONE or other transports: fsdp_alloc on the comm's device),
 * zeroed; free it with fsdp_comm_mem_free and the same mode. */
int fsdp_comm_mem_alloc(fsdp_comm *c, int mode, size_t bytes, void **out);
int fsdp_comm_mem_free(fsdp_comm *c, int mode, void *p);
int fsdp_comm_register(fsdp_comm *c, void *buf, size_t bytes, int mode, fsdp_comm_reg **out);
/* 1 when the transport really registered it, 0 when it had nothing to do */
int fsdp_comm_reg_active(const fsdp_comm_reg *r);
int fsdp_comm_deregister(fsdp_comm *c, fsdp_comm_reg *r); /* NULL: no-op */

/* The rest of the API, one header per layer; ffi.lua follows these quoted
 * includes, so they obey the same FFI-clean rules as this file. */
#include "fsdp_shard.h"
#include "fsdp_ops.h"
#include "fsdp_io.h"

#ifdef __cplusplus
}
#endif
#endif /* FSDP_H */
