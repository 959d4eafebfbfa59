/* blas_threads.c: OpenBLAS starts a thread per core in every process; with
 * several ranks on one machine that oversubscribes the cores many times
 * over. Give each local rank its share unless OPENBLAS_NUM_THREADS says. */
#include <cblas.h>
#include <stdlib.h>
#include <unistd.h>

#include "ops.h"

void fsdp_ops_set_threads(int local_size) {
  if (getenv("OPENBLAS_NUM_THREADS") || getenv("FSDP_BLAS_THREADS")) {
    const char *v = getenv("FSDP_BLAS_THREADS");
    if (v) openblas_set_num_threads(atoi(v) > 0 ? atoi(v) : 1);
    return;
  }
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int share = local_size > 0 ? (int)(cpus / local_size) : 1;
  openblas_set_num_threads(share > 0 ? share : 1);
}
