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
  fsdp_pool *ppool, *gpool;
  int W, r;
  int dev;             /* FSDP_CPU or FSDP_CUDA: where every buffer lives, but: */
  int off;             /* offload: main, m, v, gmain (and hstage) in host memory */
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
  int has_scratch;     /* holds a share of the shard comm's scratch (TMP in unit.c) */
  float *gacc; /* fp32 grad shard over the shard group: gmain, or its own S buffer with HFSDP */
  void *cshard, *cfull, *gfull;
  void *hstage;        /* offload on CUDA: the compute shard cast on the host, then copied up */
  int pslot, gslot;
  void *pbuf, *gbuf;
  fsdp_event *gathered, *ready;
  fsdp_unit_times times; /* written on the comm stream, read after it is waited for */
};

/* the compute-dtype params recomputed from the fp32 main params (unit.c) */
int fsdp_unit_publish_params(fsdp_unit *u);

#endif
