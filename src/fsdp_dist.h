/* fsdp_dist.h: the dist layer's API (src/dist/): the process and its
 * launcher (boot, identity, key/value exchange), meshes, communicators and
 * their collectives, user-buffer registration. Part of the public API:
 * included by fsdp.h, read by ffi.lua, FFI-clean like it. */
#ifndef FSDP_DIST_API_H
#define FSDP_DIST_API_H

#include "fsdp_device.h"

#ifdef __cplusplus
extern "C" {
#endif

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
int fsdp_comm_all_gather(fsdp_comm *c, void *out, const void *in, size_t count, fsdp_dtype dtype);
/* out = op over members of in[my*count .. (my+1)*count).
 * in_dtype == out_dtype, or bf16/fp16 in with fp32 out (fp32 accumulation). */
int fsdp_comm_reduce_scatter(fsdp_comm *c, void *out, fsdp_dtype out_dtype, const void *in,
                             fsdp_dtype in_dtype, size_t count, int op);
/* out = op over members of in (count elements); out may equal in. */
int fsdp_comm_all_reduce(fsdp_comm *c, void *out, const void *in, size_t count, fsdp_dtype dtype,
                         int op);
int fsdp_comm_broadcast(fsdp_comm *c, void *buf, size_t count, fsdp_dtype dtype, int root);
/* A ring shift (ring attention's blocks of keys and values): member me
 * sends in (count elements) to member (me + dist) mod n and receives out
 * from member (me - dist) mod n, both at once. dist may be any int
 * (negative: the other way round; a multiple of n: a copy). out and in
 * must not overlap. */
int fsdp_comm_shift(fsdp_comm *c, void *out, const void *in, size_t count, fsdp_dtype dtype, int dist);
int fsdp_comm_barrier(fsdp_comm *c);
/* Wait for all enqueued collectives; returns the first failure, if any. */
int fsdp_comm_synchronize(fsdp_comm *c);
/* Seconds a collective may wait for its peers before failing (default 300,
 * or FSDP_COMM_TIMEOUT in the environment). */
int fsdp_comm_set_timeout(fsdp_comm *c, double seconds);
/* A bf16/fp16 -> fp32 reduce-scatter of count elements per rank over
 * NCCL casts each rank's slice in chunks of this many elements (src/dist/
 * comm_cast_chunks.c): its fp32 staging block is size x this (the planner
 * counts it). */
size_t fsdp_comm_cast_chunk(size_t count, int size);
/* Bytes of the fp32 staging the FSDP units on this comm share (0: none). */
int64_t fsdp_comm_scratch_bytes(const fsdp_comm *c);

/* What this rank sent on the comm, by kind of collective, since the comm
 * was made or last reset: counted when a collective is issued (the call
 * returned FSDP_OK; it may still be in flight), whoever issued it (a
 * unit, Lua's comm:all_gather, the tp and cp layers), by the ring
 * algorithms' convention the planner uses, whatever the transport does:
 * of the full buffer of n members (count x n elements for an all-gather
 * and a reduce-scatter, count for an all-reduce and a broadcast),
 * (n-1)/n for an all-gather, a reduce-scatter and a broadcast, 2(n-1)/n
 * for an all-reduce; a reduce-scatter in its output (accumulation) dtype
 * (a bf16 -> fp32 one moves fp32: NCCL casts before it reduces, and the
 * planner counts reduce_dtype). A shift sends exactly its count (0 when
 * dist is a multiple of n: a copy). A barrier moves nothing. One atomic
 * add per call: any thread may issue or read. */
typedef enum {
  FSDP_COMM_ALL_GATHER = 0,
  FSDP_COMM_REDUCE_SCATTER = 1,
  FSDP_COMM_ALL_REDUCE = 2,
  FSDP_COMM_BROADCAST = 3,
  FSDP_COMM_SHIFT = 4,
  FSDP_COMM_KINDS = 5, /* how many kinds; as a kind: all of them */
} fsdp_comm_kind;
/* Bytes sent in collectives of that kind (FSDP_COMM_KINDS: all), exact
 * below 2^53; -1 for a NULL comm or an unknown kind (the error set). */
double fsdp_comm_bytes_sent(const fsdp_comm *c, int kind);
/* How many collectives of that kind were issued (FSDP_COMM_KINDS: all). */
int64_t fsdp_comm_calls(const fsdp_comm *c, int kind);
/* Both counts back to 0, every kind. */
int fsdp_comm_bytes_reset(fsdp_comm *c);

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

#ifdef __cplusplus
}
#endif
#endif /* FSDP_DIST_API_H */
