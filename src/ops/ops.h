/* ops.h: what the rest of the engine calls in the ops layer. */
#ifndef FSDP_OPS_H
#define FSDP_OPS_H

#include <stdint.h>

#include "../base/parallel.h"

/* The OpenBLAS threads an m x n x k GEMM gets (blas_threads.c). */
int fsdp_blas_threads_for(int64_t m, int64_t n, int64_t k);
/* Row-major C = alpha op(A) op(B) + beta C (op: transposed when trans_*),
 * on the threads fsdp_blas_threads_for chooses: every GEMM of the CPU ops. */
void fsdp_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
/* fn(arg, lo, hi) over items [0, n) shared among the rank's CPU threads,
 * every fsdp_sgemm inside on its caller's thread alone: for ops made of
 * many independent small GEMMs (attention's heads), which a thread each
 * runs faster than all threads in turn. Runs fn(arg, 0, n) on this thread
 * (GEMMs threaded as usual) where that would leave threads idle: fewer
 * items than threads, or the environment fixed the GEMM threads. */
void fsdp_parallel_gemms(int64_t n, fsdp_range_fn fn, void *arg);

#endif
