/* parallel.h: elementwise loops over CPU threads (parallel.c). */
#ifndef FSDP_BASE_PARALLEL_H
#define FSDP_BASE_PARALLEL_H

#include <stdint.h>

/* fn(arg, lo, hi) over [0, n) in contiguous chunks of at least grain
 * elements, on up to fsdp_cpu_threads() threads (the caller's included);
 * returns when every chunk is done. */
typedef void (*fsdp_range_fn)(void *arg, int64_t lo, int64_t hi);
void fsdp_parallel_for(int64_t n, int64_t grain, fsdp_range_fn fn, void *arg);
/* this machine's cores divided among its ranks, unless FSDP_CPU_THREADS
 * says (fsdp_init tells how many ranks share the machine) */
void fsdp_cpu_threads_share(int local_ranks);
/* the ranks sharing this machine, as fsdp_init said (0: not said yet); the
 * ops layer sizes OpenBLAS's threads by it (src/ops/blas_threads.c) */
int fsdp_host_ranks(void);

#endif
