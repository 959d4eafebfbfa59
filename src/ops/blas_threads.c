/* blas_threads.c: how many OpenBLAS threads each GEMM gets, and the one
 * place the ops call sgemm (fsdp_sgemm).
 *
 * Per process: OpenBLAS starts a thread per core in every process; with
 * several ranks on one machine that oversubscribes the cores many times
 * over, so each local rank gets its cores (fsdp_rank_cores: its share, or
 * the ones a launcher such as mpirun bound it to).
 *
 * Per call: one thread per MIN_FLOPS_PER_THREAD (4 MFLOP, ~40 us of one
 * core) of the GEMM's 2 m n k FLOPs, at most the share. Measured with the
 * demo recipe on one rank (bench/RESULTS.md, 2026-11-26): on a 16-core GPU
 * host 7.9k tok/s against 4.7k with one thread and 8.4k with all 16 (the
 * old 128 MFLOP rule kept these 17-92 MFLOP GEMMs on one thread: 4.5k); on
 * the 2-core development machine the same as one thread (9.2-9.7k against
 * 8.9-9.9k), idle or with the other core busy.
 *
 * FSDP_BLAS_THREADS=N (or OPENBLAS_NUM_THREADS) fixes the count for every
 * GEMM instead; FSDP_BLAS_MFLOP_PER_THREAD=M changes the size rule's
 * MIN_FLOPS_PER_THREAD (to measure it on another machine). */
#include <cblas.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "../base/parallel.h"
#include "../fsdp_ops.h"
#include "ops.h"

enum { MIN_FLOPS_PER_THREAD = 4 << 20 };

static _Atomic int share;   /* the most threads a GEMM may use; 0 until known */
static _Atomic int fixed;   /* 1: the environment fixed the count */
static _Atomic int current; /* what OpenBLAS was last told */
static _Atomic int sized_for = -1; /* the host's rank count share was worked out for */
static _Atomic double flops_per_thread = MIN_FLOPS_PER_THREAD;
static _Thread_local int on_one_thread; /* inside fsdp_parallel_gemms: this thread's GEMMs run on it */

static void set_threads(int n) {
  if (atomic_exchange(&current, n) != n) openblas_set_num_threads(n);
}

/* the share of this machine's cores for each of its ranks (fsdp_init says
 * how many there are: src/base/parallel.c), worked out again when that
 * changes; before fsdp_init (a test of the ops alone), OpenBLAS's own count */
static int share_now(void) {
  int ranks = fsdp_host_ranks();
  if (ranks == atomic_load(&sized_for)) return atomic_load(&share);
  const char *v = getenv("FSDP_BLAS_THREADS");
  if (v || getenv("OPENBLAS_NUM_THREADS")) {
    atomic_store(&fixed, 1);
    if (v) openblas_set_num_threads(atoi(v) > 0 ? atoi(v) : 1);
  }
  const char *m = getenv("FSDP_BLAS_MFLOP_PER_THREAD");
  if (m && atof(m) > 0) atomic_store(&flops_per_thread, atof(m) * (1 << 20));
  int n = ranks > 0 ? fsdp_rank_cores(NULL) : openblas_get_num_threads();
  atomic_store(&share, n > 0 ? n : 1);
  atomic_store(&sized_for, ranks);
  return atomic_load(&share);
}

int fsdp_blas_threads_for(int64_t m, int64_t n, int64_t k) {
  int most = share_now();
  double per = 2.0 * (double)m * (double)n * (double)k / atomic_load(&flops_per_thread);
  return per >= most ? most : per >= 2 ? (int)per : 1;
}

void fsdp_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  int threads = fsdp_blas_threads_for(m, n, k); /* (also learns whether the environment fixed the count) */
  if (!atomic_load(&fixed) && !on_one_thread) set_threads(threads);
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)m, (int)n,
              (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

typedef struct items_job {
  fsdp_range_fn fn;
  void *arg;
} items_job;

static void items_on_one_thread(void *arg, int64_t lo, int64_t hi) {
  items_job *j = arg;
  on_one_thread = 1;
  j->fn(j->arg, lo, hi);
  on_one_thread = 0;
}

void fsdp_parallel_gemms(int64_t n, fsdp_range_fn fn, void *arg) {
  share_now(); /* (learns whether the environment fixed the count) */
  const int threads = fsdp_cpu_threads();
  if (atomic_load(&fixed) || n < threads || threads < 2) {
    fn(arg, 0, n);
    return;
  }
  set_threads(1); /* OpenBLAS's count is global: one for all of them, before any starts */
  items_job j = {fn, arg};
  fsdp_parallel_for(n, 1, items_on_one_thread, &j);
}
