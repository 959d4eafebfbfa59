/* fsdp.h: the one public header of the fsdp engine.
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
  int32_t node_rank;
  int32_t num_nodes;
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

/* ---- layout: parameters in a unit's flat buffer, and their owners ------ */
typedef struct fsdp_layout fsdp_layout;
typedef struct fsdp_layout_piece {
  int32_t param;        /* index in the unit */
  int32_t rank;         /* owner, in the shard group */
  int64_t begin, end;   /* element range of the parameter */
  int64_t shard_offset; /* where begin sits in the owner's shard */
} fsdp_layout_piece;

/* Parameters packed in order, each starting at a multiple of param_align
 * elements; padded to group_size equal shards, each a multiple of
 * shard_align elements (see src/shard/layout.c). */
int fsdp_layout_create(int nparams, const int64_t *numels, int group_size, int64_t param_align,
                       int64_t shard_align, fsdp_layout **out);
int fsdp_layout_destroy(fsdp_layout *l);
int64_t fsdp_layout_numel_used(const fsdp_layout *l);   /* sum of parameter sizes */
int64_t fsdp_layout_numel_total(const fsdp_layout *l);  /* with padding: group_size * shard */
int64_t fsdp_layout_shard_numel(const fsdp_layout *l);
int64_t fsdp_layout_param_offset(const fsdp_layout *l, int param);
/* Pieces rank owns, in parameter order; returns how many (may exceed cap). */
int fsdp_layout_rank_pieces(const fsdp_layout *l, int rank, fsdp_layout_piece *out, int cap);
int fsdp_layout_owner(const fsdp_layout *l, int param, int64_t index, fsdp_layout_piece *out);

/* Meta init: fill rank's shard (shard_numel elements of dtype) with the
 * values its pieces have in the full model: element i of a parameter named
 * N is draw(seed, fsdp_rng_stream_id(N), i) under that parameter's rule.
 * Padding is zero. Independent of world size and grouping by construction. */
typedef enum { FSDP_INIT_NORMAL = 0, FSDP_INIT_UNIFORM = 1, FSDP_INIT_CONSTANT = 2 } fsdp_init_kind;
typedef struct fsdp_init_rule {
  int32_t kind;
  int32_t pad;
  double a, b; /* normal: mean, std; uniform: low, high; constant: value */
} fsdp_init_rule;
int fsdp_layout_init_shard(const fsdp_layout *l, int rank, const char *const *param_names,
                           const fsdp_init_rule *rules, uint64_t seed, void *shard, int dtype);

/* ---- optimizers on flat fp32 shards (src/shard/adamw.c) --------------- */
typedef struct fsdp_adamw_config {
  float lr, beta1, beta2, eps, weight_decay;
} fsdp_adamw_config;

/* One AdamW step over n elements; step counts from 1. param_bf16 (may be
 * NULL) receives the new values rounded to bf16 in the same pass. The
 * gradient is multiplied by grad_scale first (averaging, clipping). */
int fsdp_adamw_step(float *param, uint16_t *param_bf16, const float *grad, float *m, float *v, int64_t n,
                    int64_t step, const fsdp_adamw_config *cfg, float grad_scale);
/* SGD with momentum mu (0: plain SGD), coupled weight decay. */
int fsdp_sgd_step(float *param, uint16_t *param_bf16, const float *grad, float *momentum, int64_t n, int64_t step,
                  float lr, float mu, float weight_decay, float grad_scale);
/* CPU threads the optimizer steps (and other elementwise host loops) use:
 * FSDP_CPU_THREADS, else the machine's cores divided among its ranks. */
int fsdp_cpu_threads(void);
int fsdp_cpu_threads_set(int n);
/* Sum of squares (float64) of the finite elements, and how many were not. */
int fsdp_sum_squares(const float *x, int64_t n, double *sum, int64_t *nonfinite);

/* ---- FSDP units: flat param/grad buffers and their state machine ------ */
typedef struct fsdp_pool fsdp_pool;
typedef struct fsdp_unit fsdp_unit;

/* max_live buffers of `bytes` each (default use: 2, double buffering). */
int fsdp_pool_create(int device, size_t bytes, int max_live, fsdp_pool **out);
void fsdp_pool_destroy(fsdp_pool *p);
int fsdp_pool_live(const fsdp_pool *p);
int fsdp_pool_peak(const fsdp_pool *p);
/* Reallocate the pool's buffers with fsdp_comm_mem_alloc and register them
 * with c in `mode` (before any is acquired; collective for windows). */
int fsdp_pool_register(fsdp_pool *p, fsdp_comm *c, int mode);

typedef enum { FSDP_OFFLOAD_OPTIMIZER = 1, FSDP_OFFLOAD_PARAMS = 2, FSDP_OFFLOAD_GRADS = 4 } fsdp_offload_bits;
typedef struct fsdp_unit_config {
  int32_t zero;          /* 0..3, see docs/ARCHITECTURE.md */
  int32_t compute_dtype; /* fp32 or bf16: params as used by compute, and grads */
  int32_t reduce_dtype;  /* fp32 (accumulate in fp32) or the compute dtype */
  int32_t grad_op;       /* FSDP_AVG or FSDP_SUM over the data-parallel ranks */
  int64_t param_align, shard_align; /* elements; see fsdp_layout_create */
  int32_t hfsdp;         /* 1: also shard the fp32 main params and optimizer state over
                            the outer group (HSDP + optimizer sharding); zero >= 1 */
  int32_t offload;       /* fsdp_offload_bits, 0: none. Any bit: the fp32 main params,
                            optimizer state and the grads it reads live in (pinned) host
                            memory and the step runs on CPU threads; zero >= 1, not with
                            hfsdp. PARAMS: the compute-dtype param shard too (zero 3; on GPUs
                            copied up before each all-gather). GRADS: no fp32 grad shard on
                            the device either; reductions land in the host's (no HSDP) */
  int32_t comm_register; /* fsdp_comm_reg_mode for the buffers the shard group's collectives
                            read and write (compute shard, full params and grads); 0: none */
} fsdp_unit_config;

/* A unit of parameters sharded over `shard` (and, HSDP, replicated over
 * `outer`, may be NULL). Its reductions over the shard group run on
 * `reduce` (the same members on another channel, so that they overlap the
 * all-gathers on `shard`; NULL: on `shard`), which also holds the shared
 * reduce scratch. Materialises only this rank's shard (meta init).
 * zero 3 takes full param buffers from param_pool; zero 2/3 take full grad
 * buffers from grad_pool. */
int fsdp_unit_create(const char *name, int nparams, const char *const *param_names, const int64_t *numels,
                     const fsdp_init_rule *rules, const uint8_t *no_decay, uint64_t seed, fsdp_comm *shard,
                     fsdp_comm *reduce, fsdp_comm *outer, const fsdp_unit_config *cfg, fsdp_pool *param_pool,
                     fsdp_pool *grad_pool, fsdp_unit **out);
int fsdp_unit_destroy(fsdp_unit *u);
const fsdp_layout *fsdp_unit_layout(const fsdp_unit *u);
/* Start gathering the full params (zero 3; no-op otherwise). 1: not started,
 * the pool is at its bound (prefetch stops there). */
int fsdp_unit_unshard(fsdp_unit *u);
/* unshard for a unit needed later: also 1 (not started) while the unit's
 * offloaded step is still running on the host, instead of waiting for it. */
int fsdp_unit_prefetch(fsdp_unit *u);
/* compute (NULL: the calling thread) waits until the full params are there. */
int fsdp_unit_wait(fsdp_unit *u, fsdp_stream *compute);
/* The full compute-dtype params (after wait), or NULL while sharded. */
void *fsdp_unit_params(fsdp_unit *u);
/* Give the full buffer back once compute's work so far is done (zero 3). */
int fsdp_unit_reshard(fsdp_unit *u, fsdp_stream *compute);
/* The full grad buffer to accumulate into (zeroed when first handed out). */
int fsdp_unit_grads(fsdp_unit *u, fsdp_stream *compute, void **out);
/* Reduce the grads written by compute so far: sync = 0 for a micro-batch
 * that is not the last (zero 0/1 then wait; zero 2/3 reduce-scatter and
 * accumulate into the fp32 shard), 1 for the last. Asynchronous. */
int fsdp_unit_reduce(fsdp_unit *u, fsdp_stream *compute, int sync);
int fsdp_unit_synchronize(fsdp_unit *u);
/* This rank's part of the squared grad norm (sum over the shard group gives
 * the unit's total) and its non-finite count. Call after synchronize. */
int fsdp_unit_grad_sumsq(fsdp_unit *u, double *sum, int64_t *nonfinite);
/* The same in two halves, so that the sum is computed while other units
 * still run their backward: start right after the unit's last reduce
 * (queued behind it on the comm stream: no host wait), get after the
 * backward (waits for the unit's streams; one small copy on a GPU). */
int fsdp_unit_grad_norm_start(fsdp_unit *u);
int fsdp_unit_grad_norm_get(fsdp_unit *u, double *sum, int64_t *nonfinite);
/* AdamW on the owned fp32 main params, write back to the compute params
 * (zero 3: the shard; zero 1/2: all-gathered into the full params), zero
 * the grads. An offloaded unit queues the step on the host and returns at
 * once: its next unshard / wait (or any call that reads its state) orders
 * the new params after it (src/shard/offload.c). */
int fsdp_unit_step(fsdp_unit *u, int64_t step, const fsdp_adamw_config *cfg, float grad_scale);
/* The same with SGD (momentum buffer in the AdamW m state). */
int fsdp_unit_step_sgd(fsdp_unit *u, int64_t step, float lr, float momentum, float weight_decay, float grad_scale);
/* Drop the reduced grads without a step (e.g. non-finite grads somewhere). */
int fsdp_unit_zero_grad(fsdp_unit *u);
/* A view (no copy) of parameter i inside the unit's full buffers, shaped
 * (ndim, shape) with numel equal to the parameter's: which = FSDP_VIEW_PARAM
 * for its compute-dtype values (zero 3: after unshard + wait, until
 * reshard), FSDP_VIEW_GRAD for its full gradient (after fsdp_unit_grads,
 * until reduce). ESTATE while the buffer is not there. */
/* When the unit's last all-gather and last reduction (over the shard group)
 * began and ended on the comm stream, and its last offloaded step on the
 * host, in fsdp_time_now() seconds (0: none yet). Read after waiting for
 * that work (unit_wait, unit_synchronize). */
typedef struct fsdp_unit_times {
  double gather_begin, gather_end, reduce_begin, reduce_end, step_begin, step_end;
} fsdp_unit_times;
int fsdp_unit_times_get(const fsdp_unit *u, fsdp_unit_times *out);
typedef enum { FSDP_VIEW_PARAM = 0, FSDP_VIEW_GRAD = 1 } fsdp_unit_view_kind;
int fsdp_unit_param_view(fsdp_unit *u, int param, int which, int ndim, const int64_t *shape, fsdp_tensor *out);

/* Bytes this rank keeps resident for the unit, per buffer (full buffers
 * borrowed from the pools are not counted: the pools own them). */
typedef struct fsdp_unit_memory {
  int64_t params_full;    /* compute-dtype full params (zero 0-2) */
  int64_t params_shard;   /* compute-dtype param shard (zero 1-3) */
  int64_t main_params;    /* fp32 main params */
  int64_t optimizer;      /* AdamW m and v */
  int64_t grads_full;     /* compute-dtype full grads (zero 0-1) */
  int64_t grads_main;     /* fp32 grads the optimizer reads */
  int64_t scratch;        /* 0: the fp32 reduce-scatter staging is shared by the
                             units of a shard group (fsdp_comm_scratch_bytes) */
  int64_t shard_numel, total_numel;
  int64_t offloaded;      /* of the above, bytes in host memory (offload), with the
                             host staging of the compute shard */
} fsdp_unit_memory;
int fsdp_unit_memory_info(const fsdp_unit *u, fsdp_unit_memory *out);

/* A unit's training state, for checkpoints (src/shard/unit_state.c): the
 * fp32 main params and the optimizer's arrays (AdamW: exp_avg, exp_avg_sq;
 * SGD: momentum in OPT1), as this rank holds them (fsdp_unit_state_numel
 * elements each). Pieces: param, element range [begin, end) and, in
 * shard_offset, where the range starts in the state arrays; to_save = 0:
 * every piece this rank holds, 1: the disjoint part it saves. Returns the
 * count (may exceed cap). */
typedef enum { FSDP_STATE_PARAM = 0, FSDP_STATE_OPT1 = 1, FSDP_STATE_OPT2 = 2 } fsdp_unit_state_kind;
int fsdp_unit_state_pieces(const fsdp_unit *u, int to_save, fsdp_layout_piece *out, int cap);
int64_t fsdp_unit_state_numel(const fsdp_unit *u);
int fsdp_unit_state_get(fsdp_unit *u, int kind, int64_t off, int64_t n, float *dst);
int fsdp_unit_state_set(fsdp_unit *u, int kind, int64_t off, int64_t n, const float *src);
/* After setting the main params: the compute params from them (collective
 * over the shard group, and the outer group with hfsdp). */
int fsdp_unit_state_publish(fsdp_unit *u);

/* The rest of the API, one header per layer; ffi.lua follows these quoted
 * includes, so they obey the same FFI-clean rules as this file. */
#include "fsdp_ops.h"
#include "fsdp_io.h"

#ifdef __cplusplus
}
#endif
#endif /* FSDP_H */
