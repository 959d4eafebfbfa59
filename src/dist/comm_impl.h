/* comm_impl.h: what a collective transport implements. comm.c checks the
 * arguments once for every backend; a backend only moves bytes. */
#ifndef FSDP_DIST_COMM_IMPL_H
#define FSDP_DIST_COMM_IMPL_H

#include "../fsdp_dist.h"

typedef struct comm_ops {
  const char *transport; /* "shm", "nccl" */
  /* All enqueue on c->stream and return; arguments are already checked. */
  int (*all_gather)(fsdp_comm *c, void *out, const void *in, size_t count, int dtype);
  int (*reduce_scatter)(fsdp_comm *c, void *out, int out_dtype, const void *in, int in_dtype,
                        size_t count, int op);
  int (*all_reduce)(fsdp_comm *c, void *out, const void *in, size_t count, int dtype, int op);
  int (*broadcast)(fsdp_comm *c, void *buf, size_t count, int dtype, int root);
  /* dist already reduced to [0, size); out and in do not overlap */
  int (*shift)(fsdp_comm *c, void *out, const void *in, size_t count, int dtype, int dist);
  int (*barrier)(fsdp_comm *c);
  /* Optional: wait for the comm's pending work with a bounded wait (NCCL polls
   * for async errors). NULL: fsdp_stream_synchronize(c->stream). */
  int (*synchronize)(fsdp_comm *c);
  /* Waits for pending work and frees impl (and the stream). */
  void (*destroy)(fsdp_comm *c);
  /* Optional (comm_register.c): memory the transport can register (NCCL:
   * ncclMemAlloc, cuMem-backed, what NVLink SHARP needs), and registering
   * it (mode FSDP_REG_BUFFER or FSDP_REG_WINDOW). NULL: plain device memory,
   * and registration is a no-op. */
  int (*mem_alloc)(fsdp_comm *c, size_t bytes, void **out);
  void (*mem_free)(fsdp_comm *c, void *p);
  int (*register_buffer)(fsdp_comm *c, void *buf, size_t bytes, int mode, void **handle);
  void (*deregister_buffer)(fsdp_comm *c, void *handle, int mode);
} comm_ops;

struct fsdp_comm {
  const comm_ops *ops;
  char name[128];   /* e.g. "dp_shard[2]": the dims and which group */
  int rank, size;   /* position in the group, group size */
  int *members;     /* global ranks, in group order */
  int device;
  double timeout_s;
  fsdp_stream *stream;
  void *impl;
  /* staging shared by the units on this comm (their reduce-scatters run one
   * after another on its stream): as big as the largest unit needs */
  void *scratch;
  size_t scratch_bytes;
  int scratch_users;
  /* counted references: the mesh's, and one per unit or pool that uses the
   * comm, so whichever is destroyed last (Lua's collector at exit runs
   * finalizers in no set order) frees it */
  int refs;
  /* what fsdp_comm_bytes_sent reads: per kind (fsdp_comm_kind), the full
   * buffers' bytes issued and the calls, atomically added (comm.c) */
  uint64_t full_bytes[FSDP_COMM_KINDS];
  uint64_t calls[FSDP_COMM_KINDS];
};

/* A unit takes the comm's scratch, grown to at least bytes (waits for the
 * stream before replacing a smaller one), and gives it back when destroyed;
 * the last user frees it. */
int fsdp_comm_scratch_reserve(fsdp_comm *c, size_t bytes);
void fsdp_comm_scratch_release(fsdp_comm *c);

/* Group construction. Collective over the whole world: every rank calls it
 * at the same time (each with its own group's members); the transport's
 * rendezvous data travels through the PMIx fence. tag is unique per group. */
typedef struct comm_group_spec {
  const char *name;
  const char *tag;
  const int *members;
  int size;
  int my_index;
} comm_group_spec;

int fsdp_comm_shm_create(const comm_group_spec *spec, fsdp_comm **out);
int fsdp_comm_nccl_create(const comm_group_spec *spec, fsdp_comm **out);
/* After a member tried to join its group (my_rc: how it went), every member
 * says so to the others through one more world fence (every rank calls it
 * once, member or not); fails when any member of this group could not. key
 * is the group's unique rendezvous key. */
int fsdp_comm_joined_everywhere(const comm_group_spec *spec, const char *key, int my_rc);
/* Frees a comm now (its constructor's error path). */
void fsdp_comm_free(fsdp_comm *c);
/* One more reference to c, or one less: the last release frees it. A new
 * comm has one (its mesh's). NULL: no-op. */
void fsdp_comm_retain(fsdp_comm *c);
void fsdp_comm_release(fsdp_comm *c);

/* Shared by the backends: fills the common fields of a new comm. */
int fsdp_comm_init_common(fsdp_comm *c, const comm_group_spec *spec, int device, const comm_ops *ops);

/* launcher_env.c: what the launcher and the environment tell a rank.
 * A singleton whose environment shows several tasks (SLURM_*, PMI_*, ...)
 * fails: no PMIx server, each task would run alone. */
int fsdp_launcher_check_singleton(void);
/* Reads every rank's host (PMIX_HOSTNAME; FSDP_TEST_HOSTS in tests) and
 * gives this rank's dense node index (sorted distinct names). */
int fsdp_hosts_load(const char *nspace, int size, int rank, int *node_index, int *num_nodes);
const char *fsdp_host_of(int rank); /* NULL: not known */
/* FSDP_COMM_TIMEOUT, else 300 s: how long collectives and fences wait */
double fsdp_comm_default_timeout(void);
/* Fails (naming each host's ranks) when the members are on several hosts. */
int fsdp_hosts_check_one(const char *group, const int *members, int n);
/* Each fence publishes its number; after a fence cut short, the ranks whose
 * number did not arrive ("3, 5"; returns how many). */
int fsdp_fence_mark(uint32_t n);
int fsdp_fence_missing(const char *nspace, int size, int me, uint32_t n, char *buf, size_t cap);
/* PMIx events that say a peer ended; fsdp_peer_left: its rank, or -1. */
void fsdp_peer_events_register(void);
int fsdp_peer_left(void);

/* comm_cast_chunks.c: a bf16/fp16 -> fp32 reduce-scatter of count
 * elements per rank in chunks of `chunk` (fsdp_comm_cast_chunk) through a
 * staging block of size x chunk fp32 elements. The transport's two steps,
 * enqueued in order on its stream:
 * cast rows x cols elements, rows src_stride apart, into dst (rows x cols,
 * dense); reduce-scatter count fp32 elements per rank from in to out. */
typedef struct comm_cast_steps {
  void *ctx;
  int (*cast_rows)(void *ctx, float *dst, const void *src, size_t rows, size_t cols, size_t src_stride);
  int (*reduce_scatter)(void *ctx, float *out, const float *in, size_t count);
} comm_cast_steps;
int fsdp_comm_cast_reduce_scatter(size_t count, int size, size_t chunk, size_t in_elem_bytes, float *stage, float *out,
                                  const void *in, const comm_cast_steps *steps);

#endif
