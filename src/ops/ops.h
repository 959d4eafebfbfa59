/* ops.h: what the rest of the engine calls in the ops layer. */
#ifndef FSDP_OPS_H
#define FSDP_OPS_H

/* Called by fsdp_init: BLAS threads per rank (see blas_threads.c). */
void fsdp_ops_set_threads(int local_size);

#endif
