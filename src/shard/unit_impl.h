/* unit_impl.h: the FSDP unit's fields, shared by unit.c (the state machine)
 * and unit_state.c (its training state, for checkpoints). */
#ifndef FSDP_SHARD_UNIT_IMPL_H
#define FSDP_SHARD_UNIT_IMPL_H

#include "../device/device_impl.h"
#include "../dist/comm_impl.h"
#include "../fsdp.h"
#include "pool.h"

struct fsdp_unit {
  char name[128];
  fsdp_unit_config cfg;
  fsdp_layout *layout;
  int np;
  int64_t *numels;
  uint8_t *no_decay;
  fsdp_comm *shard, *outer;
  fsdp_comm *red;      /* reductions over the shard group: the same members on another channel, or shard */
  fsdp_pool *ppool, *gpool;
  int W, r;
  int dev;             /* FSDP_CPU or FSDP_CUDA: where every buffer lives, but: */
  int off;             /* offload: main, m, v, gmain (and hstage) in host memory */
  int offp;            /* FSDP_OFFLOAD_PARAMS on CUDA (zero 3): no device shard; hstage is the param
                          shard, copied up into the shard comm's scratch before each all-gather */
  int offg;            /* FSDP_OFFLOAD_GRADS: gacc is gmain (host): reductions go through the
                          scratch into it (kernels write pinned memory on GPUs); the step zeroes it */
  void *sums;          /* CUDA: the grad norm's device counters (double, int64) */
  int norm_pending;    /* grad_norm_start queued the sum of squares behind the reduction */
  double hsum;         /* CPU ranks: its result, written on the comm stream */
  int64_t hbad;
  int hstatus;
  int64_t S, T;
  int64_t n_opt, sub;  /* the optimizer owns [sub, sub + n_opt) of the shard (zero 0: all T) */
  int hf;              /* HFSDP: the optimizer's range is 1/R of the shard */
  size_t ces;
  float *main, *m, *v, *gmain;
  int has_scratch;     /* holds a share of the reduce comm's scratch (TMP in unit.c) */
  int has_gstage;      /* offp: holds a share of the shard comm's scratch (gather staging) */
  float *gacc; /* fp32 grad shard over the shard group: gmain, or its own S buffer with HFSDP */
  void *cshard, *cfull, *gfull; /* with cfg.comm_register: from the shard comm, registered there */
  int alias;           /* fp32 compute in place: cshard (zero >= 1) or cfull (zero 0) is main itself */
  fsdp_comm_reg *reg[3];
  fsdp_comm *regc[3];  /* the comm each is registered with */
  int nreg;
  void *hstage;        /* offload on CUDA: the compute shard cast on the host, then copied up */
  int pslot, gslot;
  void *pbuf, *gbuf;
  fsdp_event *gathered, *ready;
  fsdp_event *zeroed;  /* CUDA, red != shard: the step's zeroing of gmain, which the next reduction waits for */
  fsdp_unit_times times; /* written on the comm stream, read after it is waited for */
  /* offload (offload.c): the step runs on the shared host stream while the
   * next forward starts; settle() before the params are used again */
  fsdp_stream *host, *xfer; /* the shared host stream, and (CUDA) the host-transfer stream */
  fsdp_event *stepped;      /* host stream: the step's new values are in the staging */
  fsdp_event *reduced, *moved, *uploaded; /* CUDA: grads reduced, copied down; params copied up */
  int step_pending;         /* a step is queued on the host stream, not yet settled */
  int gstale;               /* gmain holds grads a step already consumed (no reduce since) */
};

/* An optimizer update of elements [off, off + len) of the optimizer's
 * arrays, which belong to parameter `param` (unit.c). With stage set the
 * new values also go to stage + off in the compute dtype, in the same pass
 * (the compute params in place, the host staging when offloaded). */
typedef struct fsdp_step_args {
  int64_t step;
  float grad_scale;
  const fsdp_adamw_config *adamw;
  float lr, momentum, weight_decay; /* SGD */
  void *stage;
} fsdp_step_args;
typedef int (*fsdp_update_fn)(fsdp_unit *u, const fsdp_step_args *a, int64_t off, int64_t len, int param);

/* unit.c: update pieces ps[0..k) (with a->stage, the new compute-dtype
 * values there too), the in-place step's loop and the offloaded one's */
int fsdp_unit_update_pieces(fsdp_unit *u, fsdp_update_fn update, const fsdp_step_args *a, const fsdp_layout_piece *ps,
                            int k);
/* unit.c (CUDA): queue the sum of squares of g[0..n) into u->sums on s */
int fsdp_unit_norm_on_device(fsdp_unit *u, const float *g, int64_t n, fsdp_stream *s);

/* offload.c: the offloaded step, off the caller's thread */
int fsdp_offload_attach(fsdp_unit *u);
void fsdp_offload_detach(fsdp_unit *u);
/* CUDA: behind the reductions on s, the grad norm's sum on the device, then
 * the grads copied down on the transfer stream */
int fsdp_offload_grads_down(fsdp_unit *u, fsdp_stream *s);
/* CUDA: the comm stream waits until the last copy-down is done with the
 * device grads (the next step accumulates into them) */
int fsdp_offload_before_reduce(fsdp_unit *u);
/* Queue the update of pieces ps[0..k) (takes ps) and returns at once. */
int fsdp_offload_step(fsdp_unit *u, fsdp_update_fn update, const fsdp_step_args *a, fsdp_layout_piece *ps, int k);
/* Before anything uses the params or the optimizer's buffers again: order
 * the upload (CUDA) and the all-gather (zero 1/2) after the queued step.
 * CPU ranks: event-ordered, no wait; CUDA: waits for the host step. */
int fsdp_offload_settle(fsdp_unit *u);
/* 1 when a queued step has not finished yet (prefetch skips the unit) */
int fsdp_offload_busy(fsdp_unit *u);
/* CUDA: wait for the copy-down of the grads */
int fsdp_offload_synchronize(fsdp_unit *u);

/* the compute-dtype params recomputed from the fp32 main params (unit.c) */
int fsdp_unit_publish_params(fsdp_unit *u);

#endif
